// Scale and clamp passes: one read and one write of each gradient element of
// this window, in place. Elements are decoded to f32 by the element file,
// transformed in f32 and encoded back in the element type (round to nearest
// even for 16-bit types); invocations own whole units (storage words).

// g under a scale kind; for SCALE_MULTIPLY times the exact factor m * 2^e
// (`fast` is clip_fast_factor(m, e)), so that a factor below
// f32::MIN_POSITIVE or a subnormal g is not flushed on drivers that flush.
fn scaled(g: f32, kind: u32, fast: f32, m: f32, e: i32) -> f32 {
    if kind == SCALE_MULTIPLY {
        return clip_mul_exact(g, fast, m, e);
    }
    let bits = bitcast<u32>(g);
    if kind == SCALE_ZERO_FINITE && (bits & EXP_MASK) != EXP_MASK {
        return bitcast<f32>(bits & SIGN_MASK);
    }
    return f32_from_bits(QUIET_NAN);
}

// A float's bits as an integer that orders as the float does (NaN
// excluded; -0 and +0 tie). Clamping by these keys is exact on every driver:
// SwiftShader flushed the subnormal in min(max(1e-40, -1), 1) to 0, and
// infinities need no special case.
fn order_key(bits: u32) -> i32 {
    let magnitude = i32(bits & ABS_MASK);
    return select(magnitude, -magnitude, (bits & SIGN_MASK) != 0u);
}

// g clamped to the bounds whose keys are lo and hi; NaN stays NaN, and a g
// inside the bounds comes back as it was, bit for bit.
fn clamped(g: f32, lo: i32, hi: i32) -> f32 {
    let bits = bitcast<u32>(g);
    if (bits & ABS_MASK) > EXP_MASK {
        return g;
    }
    let key = order_key(bits);
    if key < lo {
        return cfg.clamp_min;
    }
    if key > hi {
        return cfg.clamp_max;
    }
    return g;
}

// scale — reads: stats.state's factor and scale_kind (from finalize), per
// tensor factors when clipping per tensor, grads of this window's chunks.
// Writes: those grads, in place.
// Dispatch: indirect from ClipState.dispatch: (stride_workgroups() or 0, 1, 1),
// workgroups striding over the window's chunks.
@compute @workgroup_size(WG)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let global_kind = stats.state.scale_kind;
    let per_tensor = global_kind == SCALE_PER_TENSOR;
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg.x; c < range.y; c += stride) {
        let ch = chunk_at(c);
        // A tensor's factor already encodes NaN/inf handling: an exact
        // multiply by 0 or NaN gives what PyTorch and TensorFlow give.
        let kind = select(global_kind, SCALE_MULTIPLY, per_tensor);
        var m = stats.state.coef_mant;
        var e = stats.state.coef_exp;
        if per_tensor {
            m = stats.tensors[ch.tensor].coef_mant;
            e = stats.tensors[ch.tensor].coef_exp;
        }
        let fast = clip_fast_factor(m, e);
        for (var i = t * UNIT; i < ch.len; i += WG * UNIT) {
            let j = ch.start + i;
            let g = bitcast<vec2<f32>>(load_unit(j));
            store_unit(j, min(UNIT, ch.len - i), vec2(scaled(g.x, kind, fast, m, e), scaled(g.y, kind, fast, m, e)));
        }
    }
}

// clamp_values — reads: cfg.clamp_min / cfg.clamp_max, grads of this
// window's chunks. Writes: those grads clamped in place; NaN stays NaN.
// Dispatch: (stride_workgroups(), 1, 1), workgroups striding over window_chunks().
@compute @workgroup_size(WG)
fn clamp_values(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lo = order_key(bitcast<u32>(cfg.clamp_min));
    let hi = order_key(bitcast<u32>(cfg.clamp_max));
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg.x; c < range.y; c += stride) {
        let ch = chunk_at(c);
        for (var i = t * UNIT; i < ch.len; i += WG * UNIT) {
            let j = ch.start + i;
            let g = bitcast<vec2<f32>>(load_unit(j));
            store_unit(j, min(UNIT, ch.len - i), vec2(clamped(g.x, lo, hi), clamped(g.y, lo, hi)));
        }
    }
}
