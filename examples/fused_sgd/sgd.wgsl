// SGD with momentum (PyTorch's: v = momentum * v + g; p -= lr * v) that
// multiplies each gradient by gradclip's clip coefficient as it loads it:
// clipping then costs no pass over the gradients of its own.

// ClipState and clip_apply come from gradclip::wgsl::CLIP_STATE, which the
// Rust side puts before this text (nothing copied by hand). With
// ClipNorm::unscale the factor is clip / S and found_inf (a subset of
// nonfinite) says the step is to be skipped.

const APPLY_COEFFICIENT: u32 = 1u; // multiply gradients by the clip factor (clip_apply)
const SKIP_NONFINITE: u32 = 2u;    // leave everything as it is when clip.nonfinite != 0

struct Sgd {
    lr: f32,
    momentum: f32,
    len: u32,
    flags: u32,
}

@group(0) @binding(0) var<storage, read_write> params: array<f32>;
@group(0) @binding(1) var<storage, read> grads: array<f32>;
@group(0) @binding(2) var<storage, read_write> velocity: array<f32>;
@group(0) @binding(3) var<storage, read> clip: ClipState;
@group(0) @binding(4) var<uniform> sgd: Sgd;

// sgd_step — reads: grads, clip (its factor and nonfinite), params, velocity.
// Writes: params and velocity, in place.
// Dispatch: (min(ceil(len / 256), 65535), 1, 1); invocations stride over len.
@compute @workgroup_size(256)
fn sgd_step(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    if (sgd.flags & SKIP_NONFINITE) != 0u && clip.nonfinite != 0u {
        return;
    }
    let apply = (sgd.flags & APPLY_COEFFICIENT) != 0u;
    for (var i = id.x; i < sgd.len; i += groups.x * 256u) {
        var g = grads[i];
        if apply {
            // Exactly the scale pass's product (PyTorch's and TensorFlow's
            // NaN/inf rules, factors below f32::MIN_POSITIVE included).
            g = clip_apply(g, clip);
        }
        let v = sgd.momentum * velocity[i] + g;
        velocity[i] = v;
        params[i] = params[i] - sgd.lr * v;
    }
}
