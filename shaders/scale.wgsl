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

// Whether the plain products r = g * fast of a block are what
// clip_mul_exact gives: each a normal number (exponent field neither 0 nor
// 255), or the signed zero of a zero g times a normal factor (zeros are
// common in gradients; a NaN or zero factor makes fast 0). `fast_ok`: fast
// is not 0.
fn products_exact(g0: vec2<f32>, g1: vec2<f32>, g2: vec2<f32>, g3: vec2<f32>, r0: vec2<f32>, r1: vec2<f32>, r2: vec2<f32>, r3: vec2<f32>, fast_ok: bool) -> bool {
    var ok = exact4(vec4(g0.x, g1.x, g2.x, g3.x), vec4(r0.x, r1.x, r2.x, r3.x), fast_ok);
    if UNIT == 2u {
        ok = ok && exact4(vec4(g0.y, g1.y, g2.y, g3.y), vec4(r0.y, r1.y, r2.y, r3.y), fast_ok);
    }
    return ok;
}

fn exact4(g: vec4<f32>, r: vec4<f32>, fast_ok: bool) -> bool {
    let e = bitcast<vec4<u32>>(r) & vec4(EXP_MASK);
    let normal = (e != vec4(0u)) & (e != vec4(EXP_MASK));
    let zero = ((bitcast<vec4<u32>>(g) & vec4(ABS_MASK)) == vec4(0u)) & vec4(fast_ok);
    return all(normal | zero);
}

// Invocation t's units of the run [start, start + len) (its team's piece,
// team_walk), LANES units loaded before any is stored (a store may alias a
// later load, so the compiler cannot hoist loads above it). A multiply
// stores plain products while products_exact holds; from the first block
// where it does not, every element goes through scaled() (clip_mul_exact).
// Separate loops rather than a branch per block: SIMD CPU drivers
// (SwiftShader) run a branch's body under a lane mask even when no lane
// takes it, so an exact path inside the fast loop cost its full price on
// every block; a loop nobody enters costs one masked pass of its body.
fn scale_run(start: u32, len: u32, t: u32, kind: u32, fast: f32, m: f32, e: i32) {
    let units = (len + UNIT - 1u) / UNIT;
    let w = team_walk(units, t);
    let s = TEAM * UNIT;
    var u = w.first;
    if kind == SCALE_MULTIPLY {
        let fast_ok = bitcast<u32>(fast) != 0u;
        for (; u + 3u * TEAM < w.end; u += 4u * TEAM) {
            let j = start + u * UNIT;
            let g0 = bitcast<vec2<f32>>(load_unit(j));
            let g1 = bitcast<vec2<f32>>(load_unit(j + s));
            let g2 = bitcast<vec2<f32>>(load_unit(j + 2u * s));
            let g3 = bitcast<vec2<f32>>(load_unit(j + 3u * s));
            let r0 = g0 * fast;
            let r1 = g1 * fast;
            let r2 = g2 * fast;
            let r3 = g3 * fast;
            if !products_exact(g0, g1, g2, g3, r0, r1, r2, r3, fast_ok) {
                break;
            }
            // Only the run's last unit can be short, and it is unit units - 1.
            let n3 = min(UNIT, len - (u + 3u * TEAM) * UNIT);
            store_unit(j, UNIT, r0);
            store_unit(j + s, UNIT, r1);
            store_unit(j + 2u * s, UNIT, r2);
            store_unit(j + 3u * s, n3, r3);
        }
    }
    for (; u + 3u * TEAM < w.end; u += 4u * TEAM) {
        let j = start + u * UNIT;
        let g0 = bitcast<vec2<f32>>(load_unit(j));
        let g1 = bitcast<vec2<f32>>(load_unit(j + s));
        let g2 = bitcast<vec2<f32>>(load_unit(j + 2u * s));
        let g3 = bitcast<vec2<f32>>(load_unit(j + 3u * s));
        let n3 = min(UNIT, len - (u + 3u * TEAM) * UNIT);
        store_unit(j, UNIT, vec2(scaled(g0.x, kind, fast, m, e), scaled(g0.y, kind, fast, m, e)));
        store_unit(j + s, UNIT, vec2(scaled(g1.x, kind, fast, m, e), scaled(g1.y, kind, fast, m, e)));
        store_unit(j + 2u * s, UNIT, vec2(scaled(g2.x, kind, fast, m, e), scaled(g2.y, kind, fast, m, e)));
        store_unit(j + 3u * s, n3, vec2(scaled(g3.x, kind, fast, m, e), scaled(g3.y, kind, fast, m, e)));
    }
    for (; u < w.end; u += TEAM) {
        let j = start + u * UNIT;
        let g = bitcast<vec2<f32>>(load_unit(j));
        store_unit(j, min(UNIT, len - u * UNIT), vec2(scaled(g.x, kind, fast, m, e), scaled(g.y, kind, fast, m, e)));
    }
}

// scale — reads: stats.state's factor and scale_kind (from finalize), per
// tensor factors when clipping per tensor, grads of this window's chunks.
// Writes: those grads, in place.
// Dispatch: indirect from ClipState.dispatch: (stride_workgroups() or 0, 1, 1),
// workgroups striding over window_chunks() (segments when clipping per
// tensor, flat chunks otherwise).
@compute @workgroup_size(WG)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let global_kind = stats.state.scale_kind;
    let per_tensor = global_kind == SCALE_PER_TENSOR;
    // A tensor's factor already encodes NaN/inf handling: an exact
    // multiply by 0 or NaN gives what PyTorch and TensorFlow give.
    let kind = select(global_kind, SCALE_MULTIPLY, per_tensor);
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg.x; c < range.y; c += stride) {
        let ch = chunk_at(c);
        var m = stats.state.coef_mant;
        var e = stats.state.coef_exp;
        if per_tensor {
            m = stats.tensors[ch.tensor].coef_mant;
            e = stats.tensors[ch.tensor].coef_exp;
        }
        scale_run(ch.start, ch.len, t, kind, clip_fast_factor(m, e), m, e);
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
        let w = team_walk((ch.len + UNIT - 1u) / UNIT, t);
        for (var u = w.first; u < w.end; u += TEAM) {
            let j = ch.start + u * UNIT;
            let g = bitcast<vec2<f32>>(load_unit(j));
            store_unit(j, min(UNIT, ch.len - u * UNIT), vec2(clamped(g.x, lo, hi), clamped(g.y, lo, hi)));
        }
    }
}
