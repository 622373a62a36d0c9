// The test model: a 2-layer perceptron (8 -> 16 tanh -> 4, mean squared
// error over a batch of 64) with its forward, backward and SGD step in WGSL,
// written against the JavaScript package only, and the same model in
// float64 JavaScript as the reference.

export const D = 8, H = 16, O = 4, N = 64;
/** Tensors in layout order; all even-sized, so 16-bit layouts need no padding. */
export const TENSORS = [["w1", H * D], ["b1", H], ["w2", O * H], ["b2", O]];
export const P = TENSORS.reduce((s, [, n]) => s + n, 0);
const W1 = 0, B1 = H * D, W2 = B1 + H, B2 = W2 + O * H;

const CONSTANTS = `
const D: u32 = ${D}u;
const H: u32 = ${H}u;
const O: u32 = ${O}u;
const N: u32 = ${N}u;
const P: u32 = ${P}u;
const W1: u32 = ${W1}u;
const B1: u32 = ${B1}u;
const W2: u32 = ${W2}u;
const B2: u32 = ${B2}u;
`;

/** Per-sample gradients and losses. */
export const BACKWARD_WGSL = CONSTANTS + `
@group(0) @binding(0) var<storage, read> params: array<f32>;          // P, packed like the gradients
@group(0) @binding(1) var<storage, read> x: array<f32>;               // N x D
@group(0) @binding(2) var<storage, read> t: array<f32>;               // N x O
@group(0) @binding(3) var<storage, read_write> per_sample: array<f32>; // N x P
@group(0) @binding(4) var<storage, read_write> loss: array<f32>;       // N

// Reads params, x and t; writes sample n's gradient row of per_sample (the
// gradient of its share of the mean loss) and loss[n]. Dispatch: one
// invocation per sample, ceil(N / 64) workgroups.
@compute @workgroup_size(64)
fn backward(@builtin(global_invocation_id) id: vec3u) {
    let n = id.x;
    if (n >= N) { return; }
    var h: array<f32, ${H}>;
    var dy: array<f32, ${O}>;
    for (var j = 0u; j < H; j++) {
        var a = params[B1 + j];
        for (var k = 0u; k < D; k++) { a += params[W1 + j * D + k] * x[n * D + k]; }
        h[j] = tanh(a);
    }
    var l = 0.0;
    for (var o = 0u; o < O; o++) {
        var y = params[B2 + o];
        for (var j = 0u; j < H; j++) { y += params[W2 + o * H + j] * h[j]; }
        let e = y - t[n * O + o];
        l += 0.5 * e * e;
        dy[o] = e / f32(N);
    }
    loss[n] = l / f32(N);
    let row = n * P;
    for (var o = 0u; o < O; o++) {
        per_sample[row + B2 + o] = dy[o];
        for (var j = 0u; j < H; j++) { per_sample[row + W2 + o * H + j] = dy[o] * h[j]; }
    }
    for (var j = 0u; j < H; j++) {
        var dh = 0.0;
        for (var o = 0u; o < O; o++) { dh += params[W2 + o * H + j] * dy[o]; }
        let da = dh * (1.0 - h[j] * h[j]);
        per_sample[row + B1 + j] = da;
        for (var k = 0u; k < D; k++) { per_sample[row + W1 + j * D + k] = da * x[n * D + k]; }
    }
}
`;

/** The batch gradient, summed over samples, written in the gradient buffer's dtype. */
export function reduceWgsl(dtype) {
  const write = {
    f32: `
@group(0) @binding(1) var<storage, read_write> grads: array<f32>;
// Reads per_sample; writes each parameter's batch gradient. Dispatch: one
// invocation per parameter, ceil(P / 64) workgroups.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) id: vec3u) {
    if (id.x >= P) { return; }
    grads[id.x] = batch_sum(id.x);
}`,
    // Two 16-bit elements per 32-bit word, element 2w in the low half.
    f16: `
@group(0) @binding(1) var<storage, read_write> grads: array<u32>;
// Reads per_sample; writes word w (parameters 2w, 2w + 1) as f16. Dispatch:
// one invocation per word, ceil(P / 128) workgroups.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) id: vec3u) {
    if (2u * id.x >= P) { return; }
    grads[id.x] = pack2x16float(vec2f(batch_sum(2u * id.x), batch_sum(2u * id.x + 1u)));
}`,
    bf16: `
@group(0) @binding(1) var<storage, read_write> grads: array<u32>;
// bf16 bits of x, rounded to nearest even (no NaN here).
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
// Reads per_sample; writes word w (parameters 2w, 2w + 1) as bf16. Dispatch:
// one invocation per word, ceil(P / 128) workgroups.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) id: vec3u) {
    if (2u * id.x >= P) { return; }
    grads[id.x] = bf16_bits(batch_sum(2u * id.x)) | (bf16_bits(batch_sum(2u * id.x + 1u)) << 16u);
}`,
  }[dtype];
  return CONSTANTS + `
@group(0) @binding(0) var<storage, read> per_sample: array<f32>;
fn batch_sum(p: u32) -> f32 {
    var s = 0.0;
    for (var n = 0u; n < N; n++) { s += per_sample[n * P + p]; }
    return s;
}
` + write;
}

/**
 * SGD on the clipped gradients; with `fused`, on the raw gradients times the
 * coefficient gradclip left in the clip state (recordNorm).
 */
export function sgdWgsl(clipStateWgsl, fused) {
  return CONSTANTS + (fused ? clipStateWgsl : "") + `
@group(0) @binding(0) var<storage, read_write> params: array<f32>;
@group(0) @binding(1) var<storage, read> grads: array<f32>;
@group(0) @binding(2) var<uniform> lr: vec4f;
${fused ? "@group(0) @binding(3) var<storage, read> clip: ClipState;" : ""}
// Reads grads${fused ? " and the clip coefficient" : ""}; updates params in place. Dispatch: one
// invocation per parameter, ceil(P / 64) workgroups.
@compute @workgroup_size(64)
fn sgd(@builtin(global_invocation_id) id: vec3u) {
    if (id.x >= P) { return; }
    params[id.x] -= lr.x * ${fused ? "clip.coefficient * " : ""}grads[id.x];
}
`;
}

/** A small deterministic PRNG (mulberry32) for the data and the weights. */
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Inputs in [-1, 1) and targets from a fixed smooth function of them, large enough for the gradients to need clipping. */
export function data(seed) {
  const r = rng(seed);
  const x = new Float32Array(N * D).map(() => 2 * r() - 1);
  const t = new Float32Array(N * O);
  for (let n = 0; n < N; n++) {
    for (let o = 0; o < O; o++) {
      let s = 0;
      for (let k = 0; k < D; k++) s += Math.sin((o + 1) * (k + 1)) * x[n * D + k];
      t[n * O + o] = 3 * Math.sin(s) + o - 1.5;
    }
  }
  return { x, t };
}

export function initialParams(seed) {
  const r = rng(seed);
  const p = new Float32Array(P);
  for (let i = 0; i < P; i++) {
    const fanIn = i < B1 ? D : i < W2 ? 1 : i < B2 ? H : 1;
    p[i] = (2 * r() - 1) / Math.sqrt(fanIn);
  }
  return p;
}

/** Loss and batch gradient in float64, from float32 parameters and data. */
export function reference(params, x, t) {
  const g = new Float64Array(P);
  let loss = 0;
  for (let n = 0; n < N; n++) {
    const h = new Float64Array(H), dy = new Float64Array(O);
    for (let j = 0; j < H; j++) {
      let a = params[B1 + j];
      for (let k = 0; k < D; k++) a += params[W1 + j * D + k] * x[n * D + k];
      h[j] = Math.tanh(a);
    }
    for (let o = 0; o < O; o++) {
      let y = params[B2 + o];
      for (let j = 0; j < H; j++) y += params[W2 + o * H + j] * h[j];
      const e = y - t[n * O + o];
      loss += (0.5 * e * e) / N;
      dy[o] = e / N;
    }
    for (let o = 0; o < O; o++) {
      g[B2 + o] += dy[o];
      for (let j = 0; j < H; j++) g[W2 + o * H + j] += dy[o] * h[j];
    }
    for (let j = 0; j < H; j++) {
      let dh = 0;
      for (let o = 0; o < O; o++) dh += params[W2 + o * H + j] * dy[o];
      const da = dh * (1 - h[j] * h[j]);
      g[B1 + j] += da;
      for (let k = 0; k < D; k++) g[W1 + j * D + k] += da * x[n * D + k];
    }
  }
  return { loss, grads: g };
}

/** PyTorch's clip_grad_norm_ in float64: the clipped gradients, the norm and the coefficient. */
export function clipReference(grads, maxNorm) {
  const norm = Math.sqrt(grads.reduce((s, v) => s + v * v, 0));
  const coefficient = Math.min(1, maxNorm / (norm + 1e-6));
  return { norm, coefficient, clipped: grads.map((v) => v * coefficient) };
}
