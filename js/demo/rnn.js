// The demo's model: a character-level recurrent network (tanh RNN, one
// layer) with its forward pass, backpropagation through time, gradient sum,
// SGD step and sampler in WGSL. Nothing here knows gradclip beyond
// CLIP_STATE_WGSL, which the clipped run's SGD step declares.

/** Sizes of one model: vocabulary V, hidden units H, T characters per sequence, B sequences per batch. */
export function shapes({ V, H, T, B }) {
  if (V > H) throw new Error(`the vocabulary (${V}) must not exceed the hidden size (${H})`);
  const WXH = 0, WHH = V * H, BH = WHH + H * H, WHY = BH + H, BY = WHY + V * H, P = BY + V;
  return { V, H, T, B, WXH, WHH, BH, WHY, BY, P, tensors: [["Wxh", V * H], ["Whh", H * H], ["bh", H], ["Why", V * H], ["by", V]] };
}

/** Losses kept on the GPU for the charts (read back every frame). */
export const HISTORY = 4096;
/** Characters the sampler writes per sample. */
export const SAMPLE_CHARS = 240;

function constants(s, textLength) {
  return `
const V: u32 = ${s.V}u;
const H: u32 = ${s.H}u;
const T: u32 = ${s.T}u;
const B: u32 = ${s.B}u;
const P: u32 = ${s.P}u;
const WXH: u32 = ${s.WXH}u;
const WHH: u32 = ${s.WHH}u;
const BH: u32 = ${s.BH}u;
const WHY: u32 = ${s.WHY}u;
const BY: u32 = ${s.BY}u;
const TEXT_LEN: u32 = ${textLength}u;
const HISTORY: u32 = ${HISTORY}u;
const SAMPLE_CHARS: u32 = ${SAMPLE_CHARS}u;
const INV_BT: f32 = ${1 / (s.B * s.T)};

struct Step {
    step: u32,        // the training step, from 1
    seed: u32,        // picks the batch's sequences and the sampler's draws
    lr: f32,
    temperature: f32,
}

// A 32-bit integer hash (PCG's output permutation): cheap, well mixed.
fn hash(x: u32) -> u32 {
    let s = x * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

// tanh that stays finite for any finite input (the builtin may compute
// (e^2a - 1) / (e^2a + 1), NaN once e^2a overflows).
fn tanh_safe(a: f32) -> f32 {
    return tanh(clamp(a, -15.0, 15.0));
}
`;
}

/** Forward and backward over each sequence; per-sequence gradients into `per_seq`. */
export function trainWgsl(s, textLength) {
  return constants(s, textLength) + `
@group(0) @binding(0) var<storage, read> params: array<f32>;
@group(0) @binding(1) var<storage, read> text: array<u32>;
@group(0) @binding(2) var<uniform> u: Step;
@group(0) @binding(3) var<storage, read_write> per_seq: array<f32>; // B x P
@group(0) @binding(4) var<storage, read_write> hs: array<f32>;      // B x (T + 1) x H
@group(0) @binding(5) var<storage, read_write> dys: array<f32>;     // B x T x V
@group(0) @binding(6) var<storage, read_write> losses: array<f32>;  // B

var<workgroup> hw: array<f32, H>;
var<workgroup> yw: array<f32, V>;
var<workgroup> dyw: array<f32, V>;
var<workgroup> dzw: array<f32, H>;
var<workgroup> lw: array<f32, H>;

// Reads params, the text and the step; writes sequence b's gradient of the
// mean cross-entropy into per_seq[b], its hidden states into hs, its output
// gradients into dys and its summed loss into losses[b]. Dispatch: one
// workgroup of H invocations per sequence (B workgroups); invocation j owns
// hidden unit j: row j of Whh, column j of Wxh and Why, and bh[j] (and by[j]
// for j < V), so no two invocations write the same gradient.
@compute @workgroup_size(H)
fn train(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) j: u32) {
    let b = wg.x;
    let off = hash(u.seed ^ hash(b * 7919u + 1u)) % (TEXT_LEN - T - 1u);
    let g = b * P;
    for (var v = 0u; v < V; v++) {
        per_seq[g + WXH + v * H + j] = 0.0;
        per_seq[g + WHY + v * H + j] = 0.0;
    }
    for (var k = 0u; k < H; k++) { per_seq[g + WHH + j * H + k] = 0.0; }
    per_seq[g + BH + j] = 0.0;
    if (j < V) { per_seq[g + BY + j] = 0.0; }
    let hbase = b * (T + 1u) * H;
    hw[j] = 0.0;
    hs[hbase + j] = 0.0;
    var loss = 0.0;
    workgroupBarrier();
    for (var t = 0u; t < T; t++) {
        let x = text[off + t];
        var a = params[WXH + x * H + j] + params[BH + j];
        for (var k = 0u; k < H; k++) { a += params[WHH + j * H + k] * hw[k]; }
        workgroupBarrier();
        let h = tanh_safe(a);
        hw[j] = h;
        hs[hbase + (t + 1u) * H + j] = h;
        workgroupBarrier();
        if (j < V) {
            var y = params[BY + j];
            for (var k = 0u; k < H; k++) { y += params[WHY + j * H + k] * hw[k]; }
            yw[j] = y;
        }
        workgroupBarrier();
        if (j < V) {
            var m = yw[0];
            for (var v = 1u; v < V; v++) { m = max(m, yw[v]); }
            var sum = 0.0;
            for (var v = 0u; v < V; v++) { sum += exp(yw[v] - m); }
            let next = text[off + t + 1u];
            let p = exp(yw[j] - m) / sum;
            dys[(b * T + t) * V + j] = (p - select(0.0, 1.0, j == next)) * INV_BT;
            if (j == next) { loss += log(sum) + m - yw[j]; }
        }
    }
    lw[j] = loss;
    var dh_next = 0.0;
    for (var i = 0u; i < T; i++) {
        let t = T - 1u - i;
        let x = text[off + t];
        let h = hs[hbase + (t + 1u) * H + j];
        if (j < V) { dyw[j] = dys[(b * T + t) * V + j]; }
        hw[j] = hs[hbase + t * H + j];
        workgroupBarrier();
        var dh = dh_next;
        for (var v = 0u; v < V; v++) {
            dh += params[WHY + v * H + j] * dyw[v];
            per_seq[g + WHY + v * H + j] += dyw[v] * h;
        }
        if (j < V) { per_seq[g + BY + j] += dyw[j]; }
        let dz = dh * (1.0 - h * h);
        dzw[j] = dz;
        per_seq[g + BH + j] += dz;
        per_seq[g + WXH + x * H + j] += dz;
        for (var k = 0u; k < H; k++) { per_seq[g + WHH + j * H + k] += dz * hw[k]; }
        workgroupBarrier();
        var dn = 0.0;
        for (var k = 0u; k < H; k++) { dn += params[WHH + k * H + j] * dzw[k]; }
        dh_next = dn;
        workgroupBarrier();
    }
    if (j == 0u) {
        var total = 0.0;
        for (var k = 0u; k < H; k++) { total += lw[k]; }
        losses[b] = total;
    }
}
`;
}

/** Sums the per-sequence gradients into the gradient buffer gradclip clips. */
export function reduceWgsl(s, textLength) {
  return constants(s, textLength) + `
@group(0) @binding(0) var<storage, read> per_seq: array<f32>;
@group(0) @binding(1) var<storage, read> losses: array<f32>;
@group(0) @binding(2) var<uniform> u: Step;
@group(0) @binding(3) var<storage, read_write> grads: array<f32>;   // P: gradclip's buffer
@group(0) @binding(4) var<storage, read_write> history: array<f32>; // HISTORY mean losses

// Reads per_seq and losses; writes each parameter's batch gradient, and
// (invocation 0) the batch's mean loss at history[step % HISTORY].
// Dispatch: one invocation per parameter, ceil(P / 64) workgroups.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) id: vec3u) {
    let p = id.x;
    if (p == 0u) {
        var l = 0.0;
        for (var b = 0u; b < B; b++) { l += losses[b]; }
        history[u.step % HISTORY] = l * INV_BT;
    }
    if (p >= P) { return; }
    var sum = 0.0;
    for (var b = 0u; b < B; b++) { sum += per_seq[b * P + p]; }
    grads[p] = sum;
}
`;
}

/**
 * SGD: with `clipped`, on the gradients times gradclip's clip factor
 * (`clip_apply`, the recordNorm of this step), else on the raw gradients.
 */
export function sgdWgsl(s, textLength, clipStateWgsl, clipped) {
  return constants(s, textLength) + (clipped ? clipStateWgsl : "") + `
@group(0) @binding(0) var<storage, read_write> params: array<f32>;
@group(0) @binding(1) var<storage, read> grads: array<f32>;
@group(0) @binding(2) var<uniform> u: Step;
${clipped ? "@group(0) @binding(3) var<storage, read> clip: ClipState;" : ""}

// Reads grads${clipped ? " and the clip state" : ""}; updates params in place.
// Dispatch: one invocation per parameter, ceil(P / 64) workgroups.
@compute @workgroup_size(64)
fn sgd(@builtin(global_invocation_id) id: vec3u) {
    if (id.x >= P) { return; }
    params[id.x] -= u.lr * ${clipped ? "clip_apply(grads[id.x], clip)" : "grads[id.x]"};
}
`;
}

/** Generates SAMPLE_CHARS characters from the model, starting after a newline. */
export function sampleWgsl(s, textLength, newline) {
  return constants(s, textLength) + `
@group(0) @binding(0) var<storage, read> params: array<f32>;
@group(0) @binding(1) var<uniform> u: Step;
@group(0) @binding(2) var<storage, read_write> out: array<u32>; // SAMPLE_CHARS

var<workgroup> hw: array<f32, H>;
var<workgroup> yw: array<f32, V>;
var<workgroup> xw: u32;

// Reads params and the step's seed and temperature; writes SAMPLE_CHARS
// sampled character indices. Dispatch: one workgroup of H invocations
// (invocation j computes hidden unit j; invocation 0 draws each character).
@compute @workgroup_size(H)
fn sample(@builtin(local_invocation_index) j: u32) {
    hw[j] = 0.0;
    if (j == 0u) { xw = ${newline}u; }
    workgroupBarrier();
    for (var i = 0u; i < SAMPLE_CHARS; i++) {
        let x = xw;
        var a = params[WXH + x * H + j] + params[BH + j];
        for (var k = 0u; k < H; k++) { a += params[WHH + j * H + k] * hw[k]; }
        workgroupBarrier();
        hw[j] = tanh_safe(a);
        workgroupBarrier();
        if (j < V) {
            var y = params[BY + j];
            for (var k = 0u; k < H; k++) { y += params[WHY + j * H + k] * hw[k]; }
            yw[j] = y / u.temperature;
        }
        workgroupBarrier();
        if (j == 0u) {
            var m = yw[0];
            for (var v = 1u; v < V; v++) { m = max(m, yw[v]); }
            var sum = 0.0;
            for (var v = 0u; v < V; v++) { sum += exp(yw[v] - m); }
            let r = f32(hash(u.seed ^ hash(i + 17u)) >> 8u) / 16777216.0 * sum;
            var c = 0.0;
            var pick = V - 1u;
            for (var v = 0u; v < V; v++) {
                c += exp(yw[v] - m);
                if (c > r) { pick = v; break; }
            }
            out[i] = pick;
            xw = pick;
        }
        workgroupBarrier();
    }
}
`;
}

/** Initial parameters, the same for both runs: small embeddings and outputs, Whh of spectral radius about 1. */
export function initialParams(s, seed) {
  let a = seed >>> 0;
  const rand = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296 * 2 - 1;
  };
  const p = new Float32Array(s.P);
  const fill = (start, n, scale) => { for (let i = 0; i < n; i++) p[start + i] = rand() * scale; };
  fill(s.WXH, s.V * s.H, 0.3);
  fill(s.WHH, s.H * s.H, Math.sqrt(3 / s.H));
  fill(s.WHY, s.V * s.H, 0.3 / Math.sqrt(s.H));
  return p;
}
