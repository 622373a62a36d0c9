// Naive per-tensor clipping: the baseline of the gradclip benchmark. It is
// what clipping costs without an offset table: one norm dispatch and one
// scale dispatch per tensor, the tensor's bounds handed to each dispatch
// through a dynamic uniform offset (the way a kernel gets its arguments),
// and one small dispatch in between for the total norm and the coefficient.
// Sums of squares are plain f32 (no overflow-safe scaling), so its
// arithmetic is cheaper than gradclip's; the scale always runs, because the
// host cannot know the coefficient without reading it back.

// Invocations per workgroup (tree reductions halve it: a power of two).
const WG: u32 = 256u;

// One tensor, written once by the host; one record per dynamic offset.
struct Tensor {
    offset: u32,        // first element in the flat buffer
    len: u32,           // elements
    partial_base: u32,  // first partial this tensor's norm dispatch writes
    workgroups: u32,    // workgroups of its norm and scale dispatches
}

// The whole clip, written once by the host.
struct Params {
    partial_count: u32, // partials written by all norm dispatches together
    max_norm: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> grads: array<f32>;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
// [total norm, coefficient]
@group(0) @binding(2) var<storage, read_write> result: array<f32, 2>;
@group(0) @binding(3) var<uniform> tensor: Tensor;
@group(0) @binding(4) var<uniform> params: Params;

var<workgroup> wg_acc: array<f32, WG>;

// Folds wg_acc into wg_acc[0]: sums (kind 0) or maxima (kind 1).
fn fold(t: u32, kind: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if t < s {
            let a = wg_acc[t];
            let b = wg_acc[t + s];
            wg_acc[t] = select(a + b, max(a, b), kind == 1u);
        }
        workgroupBarrier();
    }
}

// Workgroup wg's grid-stride share of the tensor: sum of g^2 (kind 0) or
// max |g| (kind 1).
fn tensor_partial(wg: u32, t: u32, kind: u32) {
    var acc = 0.0;
    let stride = tensor.workgroups * WG;
    for (var i = wg * WG + t; i < tensor.len; i += stride) {
        let g = grads[tensor.offset + i];
        acc = select(acc + g * g, max(acc, abs(g)), kind == 1u);
    }
    wg_acc[t] = acc;
    fold(t, kind);
    if t == 0u {
        partials[tensor.partial_base + wg] = wg_acc[0];
    }
}

// norm_l2 — reads: grads[tensor.offset ..][.. tensor.len], tensor.
// Writes: partials[tensor.partial_base + wg] = sum of squares of its share.
// Dispatch: (tensor.workgroups, 1, 1), once per tensor.
@compute @workgroup_size(WG)
fn norm_l2(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    tensor_partial(wg.x, t, 0u);
}

// norm_inf — reads: grads[tensor.offset ..][.. tensor.len], tensor.
// Writes: partials[tensor.partial_base + wg] = max |g| of its share.
// Dispatch: (tensor.workgroups, 1, 1), once per tensor.
@compute @workgroup_size(WG)
fn norm_inf(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    tensor_partial(wg.x, t, 1u);
}

// Folds all partials and writes the norm and PyTorch's coefficient.
fn total(t: u32, kind: u32) {
    var acc = 0.0;
    for (var i = t; i < params.partial_count; i += WG) {
        let p = partials[i];
        acc = select(acc + p, max(acc, p), kind == 1u);
    }
    wg_acc[t] = acc;
    fold(t, kind);
    if t == 0u {
        let norm = select(sqrt(wg_acc[0]), wg_acc[0], kind == 1u);
        result[0] = norm;
        result[1] = min(params.max_norm / (norm + 1e-6), 1.0);
    }
}

// total_l2 — reads: partials[0 .. params.partial_count), params.
// Writes: result = (sqrt of the sum, coefficient). Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn total_l2(@builtin(local_invocation_index) t: u32) {
    total(t, 0u);
}

// total_inf — reads: partials[0 .. params.partial_count), params.
// Writes: result = (the maximum, coefficient). Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn total_inf(@builtin(local_invocation_index) t: u32) {
    total(t, 1u);
}

// scale — reads: result[1], grads[tensor.offset ..][.. tensor.len], tensor.
// Writes: those grads multiplied by the coefficient, in place.
// Dispatch: (tensor.workgroups, 1, 1), once per tensor.
@compute @workgroup_size(WG)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let coef = result[1];
    let stride = tensor.workgroups * WG;
    for (var i = wg.x * WG + t; i < tensor.len; i += stride) {
        let j = tensor.offset + i;
        grads[j] = grads[j] * coef;
    }
}
