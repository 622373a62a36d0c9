// The training demo's model: a vanilla (Elman) RNN, h_t = tanh(W x_t + U h_{t-1} + b),
// y_t = V . h_t + c, trained on fresh random sequences each step to output the
// running sum of its inputs, z_t = (x_0 + ... + x_t) / sqrt(t + 1). Its
// recurrent weights start large (gain 1.5), so backpropagation through time
// multiplies gradients by U^T at every step and they explode: the textbook
// case for gradient clipping.
//
// Parameters and gradients are flat f32 arrays laid out as the host's
// GradLayout: W (H), U (H x H, row-major: U[j][k] at j * H + k), b (H), V (H), c (1).

// Hidden units: the workgroup size of forward_backward (one invocation per unit).
override HID: u32 = 32u;
// Invocations per workgroup of the per-parameter passes.
const PER_PARAM_WG: u32 = 64u;

struct Dims {
    batch: u32,       // sequences per step (one workgroup each)
    seq_len: u32,     // T
    loss_from: u32,   // the loss counts time steps t >= loss_from
    param_count: u32, // 3 H + H^2 + 1
    seed: u32,        // data seed
    lr: f32,          // SGD learning rate
    _pad0: u32,
    _pad1: u32,
}

// What a step leaves for the host's report.
struct Stats {
    step: u32,                // steps completed
    loss: f32,                // loss of the latest step (before its update)
    seq_loss: array<f32>,     // per-sequence loss of the latest step
}

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read_write> params: array<f32>;
@group(0) @binding(2) var<storage, read_write> grads: array<f32>;
// Activations of the latest step: hidden states, their gradients, inputs and
// output gradients; sections addressed by the index helpers below.
@group(0) @binding(3) var<storage, read_write> acts: array<f32>;
@group(0) @binding(4) var<storage, read_write> stats: Stats;

var<workgroup> h_prev: array<f32, HID>;
var<workgroup> da_now: array<f32, HID>;
var<workgroup> red: array<f32, HID>;

// Offsets of the parameter tensors.
fn off_u() -> u32 { return HID; }
fn off_b() -> u32 { return HID + HID * HID; }
fn off_v() -> u32 { return 2u * HID + HID * HID; }
fn off_c() -> u32 { return 3u * HID + HID * HID; }

// Sections of `acts`.
fn hist(b: u32, t: u32, j: u32) -> u32 { return (b * dims.seq_len + t) * HID + j; }
fn dpre(b: u32, t: u32, j: u32) -> u32 { return dims.batch * dims.seq_len * HID + hist(b, t, j); }
fn xin(b: u32, t: u32) -> u32 { return 2u * dims.batch * dims.seq_len * HID + b * dims.seq_len + t; }
fn dout(b: u32, t: u32) -> u32 { return xin(b, t) + dims.batch * dims.seq_len; }

// The lowbias32 integer hash (also in model.rs, which must agree bit for bit).
fn hash(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

// Input x_t of sequence b at `step`: uniform in [-1, 1), exact in f32.
fn input_at(step: u32, b: u32, t: u32) -> f32 {
    let h = hash(dims.seed ^ hash(step ^ hash(b ^ hash(t))));
    return f32(h >> 8u) * (2.0 / 16777216.0) - 1.0;
}

// tanh with its argument clamped: some GPU tanh implementations return NaN
// for large arguments, and tanh(15) is 1 in f32 already.
fn act(a: f32) -> f32 {
    return tanh(clamp(a, -15.0, 15.0));
}

// forward_backward — reads: params, dims, stats.step (the data seed of this
// step). Writes: acts (inputs, hidden states, output gradients dL/dy_t and
// pre-activation gradients dL/da_t of sequence b), stats.seq_loss[b].
// Dispatch: (dims.batch, 1, 1); workgroup b runs sequence b, invocation j
// owns hidden unit j through the forward pass and back-propagation through time.
@compute @workgroup_size(HID)
fn forward_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) j: u32) {
    let b = wg.x;
    let T = dims.seq_len;
    let step = stats.step;
    for (var t = j; t < T; t += HID) {
        acts[xin(b, t)] = input_at(step, b, t);
    }
    h_prev[j] = 0.0;
    storageBarrier();
    workgroupBarrier();

    // Forward: h_t from h_{t-1}, kept for the backward pass.
    let w = params[j];
    let bias = params[off_b() + j];
    for (var t = 0u; t < T; t++) {
        var a = w * acts[xin(b, t)] + bias;
        for (var k = 0u; k < HID; k++) {
            a += params[off_u() + j * HID + k] * h_prev[k];
        }
        let h = act(a);
        workgroupBarrier();
        h_prev[j] = h;
        acts[hist(b, t, j)] = h;
        workgroupBarrier();
    }
    storageBarrier();

    // Outputs, targets and dL/dy_t, invocation j taking t = j, j + HID, ...
    let scale = 1.0 / f32(dims.batch * (T - dims.loss_from));
    var loss = 0.0;
    for (var t = j; t < T; t += HID) {
        var y = params[off_c()];
        for (var k = 0u; k < HID; k++) {
            y += params[off_v() + k] * acts[hist(b, t, k)];
        }
        var sum = 0.0;
        for (var u = 0u; u <= t; u++) {
            sum += acts[xin(b, u)];
        }
        let z = sum / sqrt(f32(t + 1u));
        var dy = 0.0;
        if t >= dims.loss_from {
            let e = y - z;
            loss += e * e;
            dy = 2.0 * e * scale;
        }
        acts[dout(b, t)] = dy;
    }
    red[j] = loss;
    storageBarrier();
    workgroupBarrier();
    for (var s = HID / 2u; s > 0u; s >>= 1u) {
        if j < s {
            red[j] += red[j + s];
        }
        workgroupBarrier();
    }
    if j == 0u {
        stats.seq_loss[b] = red[0] * scale;
    }

    // Back-propagation through time: dh_t = V dy_t + U^T da_{t+1},
    // da_t = dh_t (1 - h_t^2).
    let v = params[off_v() + j];
    var dh = 0.0;
    for (var n = 0u; n < T; n++) {
        let t = T - 1u - n;
        dh += v * acts[dout(b, t)];
        let h = acts[hist(b, t, j)];
        let da = dh * (1.0 - h * h);
        acts[dpre(b, t, j)] = da;
        da_now[j] = da;
        workgroupBarrier();
        var s = 0.0;
        for (var k = 0u; k < HID; k++) {
            s += params[off_u() + k * HID + j] * da_now[k];
        }
        dh = s;
        workgroupBarrier();
    }
}

// gradients — reads: acts (all sequences' dL/da_t, dL/dy_t, h_t, x_t from
// forward_backward), stats.seq_loss. Writes: grads[p] for every parameter p,
// summed over sequences and time in a fixed order (deterministic); invocation
// 0 also writes stats.loss and counts the step.
// Dispatch: (ceil(dims.param_count / 64), 1, 1), one invocation per parameter.
@compute @workgroup_size(PER_PARAM_WG)
fn gradients(@builtin(global_invocation_id) gid: vec3<u32>) {
    let p = gid.x;
    if p >= dims.param_count {
        return;
    }
    let T = dims.seq_len;
    var g = 0.0;
    if p < off_u() {
        // W[j]: sum of dL/da_t[j] x_t
        for (var b = 0u; b < dims.batch; b++) {
            for (var t = 0u; t < T; t++) {
                g += acts[dpre(b, t, p)] * acts[xin(b, t)];
            }
        }
    } else if p < off_b() {
        // U[j][k]: sum of dL/da_t[j] h_{t-1}[k]
        let j = (p - off_u()) / HID;
        let k = (p - off_u()) % HID;
        for (var b = 0u; b < dims.batch; b++) {
            for (var t = 1u; t < T; t++) {
                g += acts[dpre(b, t, j)] * acts[hist(b, t - 1u, k)];
            }
        }
    } else if p < off_v() {
        // b[j]: sum of dL/da_t[j]
        let j = p - off_b();
        for (var b = 0u; b < dims.batch; b++) {
            for (var t = 0u; t < T; t++) {
                g += acts[dpre(b, t, j)];
            }
        }
    } else if p < off_c() {
        // V[j]: sum of dL/dy_t h_t[j]
        let j = p - off_v();
        for (var b = 0u; b < dims.batch; b++) {
            for (var t = 0u; t < T; t++) {
                g += acts[dout(b, t)] * acts[hist(b, t, j)];
            }
        }
    } else {
        // c: sum of dL/dy_t
        for (var b = 0u; b < dims.batch; b++) {
            for (var t = 0u; t < T; t++) {
                g += acts[dout(b, t)];
            }
        }
    }
    grads[p] = g;
    if p == 0u {
        var loss = 0.0;
        for (var b = 0u; b < dims.batch; b++) {
            loss += stats.seq_loss[b];
        }
        stats.loss = loss;
        stats.step += 1u;
    }
}

// sgd_step — reads: grads (clipped in place by gradclip), dims.lr. Writes:
// params[p] -= lr * grads[p].
// Dispatch: (ceil(dims.param_count / 64), 1, 1), one invocation per parameter.
@compute @workgroup_size(PER_PARAM_WG)
fn sgd_step(@builtin(global_invocation_id) gid: vec3<u32>) {
    let p = gid.x;
    if p < dims.param_count {
        params[p] -= dims.lr * grads[p];
    }
}
