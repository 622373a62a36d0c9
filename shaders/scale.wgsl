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

// LANES (4) units of a run, TEAM units apart: what one invocation loads
// before it stores any (a store may alias a later load, so the compiler
// cannot hoist loads above it).
struct Block {
    u0: vec2<f32>,
    u1: vec2<f32>,
    u2: vec2<f32>,
    u3: vec2<f32>,
}

// The block whose first unit starts at element j (s = TEAM * UNIT).
fn load_block(j: u32, s: u32) -> Block {
    return Block(
        bitcast<vec2<f32>>(load_unit(j)),
        bitcast<vec2<f32>>(load_unit(j + s)),
        bitcast<vec2<f32>>(load_unit(j + 2u * s)),
        bitcast<vec2<f32>>(load_unit(j + 3u * s)),
    );
}

// Stores a block loaded by load_block(j, s); its last unit has n3 elements
// (only a run's last unit can be short, and only the last unit of a block
// can be a run's last).
fn store_block(j: u32, s: u32, n3: u32, b: Block) {
    store_unit(j, UNIT, b.u0);
    store_unit(j + s, UNIT, b.u1);
    store_unit(j + 2u * s, UNIT, b.u2);
    store_unit(j + 3u * s, n3, b.u3);
}

// A unit's elements through scaled().
fn scaled_unit(g: vec2<f32>, kind: u32, fast: f32, m: f32, e: i32) -> vec2<f32> {
    return vec2(scaled(g.x, kind, fast, m, e), scaled(g.y, kind, fast, m, e));
}

// Whether the plain products r = g * fast of a block are what
// clip_mul_exact gives: each a normal number (exponent field neither 0 nor
// 255), or the signed zero of a zero g times a normal factor (zeros are
// common in gradients; a NaN or zero factor makes fast 0). `fast_ok`: fast
// is not 0.
fn products_exact(g: Block, r: Block, fast_ok: bool) -> bool {
    var ok = exact4(vec4(g.u0.x, g.u1.x, g.u2.x, g.u3.x), vec4(r.u0.x, r.u1.x, r.u2.x, r.u3.x), fast_ok);
    if UNIT == 2u {
        ok = ok && exact4(vec4(g.u0.y, g.u1.y, g.u2.y, g.u3.y), vec4(r.u0.y, r.u1.y, r.u2.y, r.u3.y), fast_ok);
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
// team_walk), a Block at a time, then the rest one unit at a time. A
// multiply stores plain products while products_exact holds; from the
// first block where it does not, every element goes through scaled()
// (clip_mul_exact). Separate loops rather than a branch per block: SIMD CPU
// drivers (SwiftShader) run a branch's body under a lane mask even when no
// lane takes it, so an exact path inside the fast loop cost its full price
// on every block; a loop nobody enters costs one masked pass of its body.
fn scale_run(start: u32, len: u32, t: u32, kind: u32, fast: f32, m: f32, e: i32) {
    let units = (len + UNIT - 1u) / UNIT;
    let w = team_walk(units, t);
    let s = TEAM * UNIT;
    var u = w.first;
    if kind == SCALE_MULTIPLY {
        let fast_ok = bitcast<u32>(fast) != 0u;
        for (; u + 3u * TEAM < w.end; u += 4u * TEAM) {
            let j = start + u * UNIT;
            let g = load_block(j, s);
            let r = Block(g.u0 * fast, g.u1 * fast, g.u2 * fast, g.u3 * fast);
            if !products_exact(g, r, fast_ok) {
                break;
            }
            store_block(j, s, min(UNIT, len - (u + 3u * TEAM) * UNIT), r);
        }
    }
    for (; u + 3u * TEAM < w.end; u += 4u * TEAM) {
        let j = start + u * UNIT;
        let g = load_block(j, s);
        let r = Block(
            scaled_unit(g.u0, kind, fast, m, e),
            scaled_unit(g.u1, kind, fast, m, e),
            scaled_unit(g.u2, kind, fast, m, e),
            scaled_unit(g.u3, kind, fast, m, e),
        );
        store_block(j, s, min(UNIT, len - (u + 3u * TEAM) * UNIT), r);
    }
    for (; u < w.end; u += TEAM) {
        let j = start + u * UNIT;
        store_unit(j, min(UNIT, len - u * UNIT), scaled_unit(bitcast<vec2<f32>>(load_unit(j)), kind, fast, m, e));
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
