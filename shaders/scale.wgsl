// Scale and clamp passes: one read and one write of each gradient element of
// this window, in place. Elements are decoded to f32 by the element file,
// transformed in f32 and encoded back in the element type (round to nearest
// even for 16-bit types). Runs are walked in quads as the reduce pass walks
// them (elem_f32.wgsl): the quads wholly inside a run are stored whole, the
// edge quads it shares with its neighbours one element at a time.

// g under a scale kind; for CLIP_SCALE_MULTIPLY times the exact factor m * 2^e
// (`fast` is clip_fast_factor(m, e)), so that a factor below
// f32::MIN_POSITIVE or a subnormal g is not flushed on drivers that flush.
fn scaled(g: f32, kind: u32, fast: f32, m: f32, e: i32) -> f32 {
    if kind == CLIP_SCALE_MULTIPLY {
        return clip_mul_exact(g, fast, m, e);
    }
    let bits = bitcast<u32>(g);
    if kind == CLIP_SCALE_ZERO_FINITE && (bits & EXP_MASK) != EXP_MASK {
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

// Stores the elements of v that lie inside run r, alone: the rest of quad
// q belongs to other runs, which other invocations may be writing.
fn store_inside(q: u32, r: Run, v: vec4<f32>) {
    let i = vec4(4u * q) + vec4(0u, 1u, 2u, 3u);
    let inside = (i >= vec4(r.start)) & (i < vec4(r.end));
    if inside.x {
        store_element(q, 0u, v.x);
    }
    if inside.y {
        store_element(q, 1u, v.y);
    }
    if inside.z {
        store_element(q, 2u, v.z);
    }
    if inside.w {
        store_element(q, 3u, v.w);
    }
}

// Four quads of a run, TEAM apart: what one invocation loads before it
// stores any (a store may alias a later load, so the compiler cannot hoist
// loads above it), as many as the reduce's step (LANES) and the multiply
// roofline's fastest shape. Two were faster on SwiftShader on an older
// host (10^7 elements, 23.8-26.3 ms against 26.0-27.7 with four); on
// today's 2-core EPYC four are (the L2 clip's scale pass 18.9-23.0 ms ->
// 17.7-18.6, 73-79% of the multiply roofline -> 80-90%, paired), and
// lavapipe and llvmpipe GL run the same with either.
struct Block {
    q0: vec4<f32>,
    q1: vec4<f32>,
    q2: vec4<f32>,
    q3: vec4<f32>,
}

fn load_block(q: u32) -> Block {
    return Block(
        bitcast<vec4<f32>>(load_quad(q)),
        bitcast<vec4<f32>>(load_quad(q + TEAM)),
        bitcast<vec4<f32>>(load_quad(q + 2u * TEAM)),
        bitcast<vec4<f32>>(load_quad(q + 3u * TEAM)),
    );
}

fn store_block(q: u32, b: Block) {
    store_quad(q, b.q0);
    store_quad(q + TEAM, b.q1);
    store_quad(q + 2u * TEAM, b.q2);
    store_quad(q + 3u * TEAM, b.q3);
}

// A quad's elements through scaled().
fn scaled_quad(g: vec4<f32>, kind: u32, fast: f32, m: f32, e: i32) -> vec4<f32> {
    return vec4(scaled(g.x, kind, fast, m, e), scaled(g.y, kind, fast, m, e), scaled(g.z, kind, fast, m, e), scaled(g.w, kind, fast, m, e));
}

// The |g| bits (sign cleared) from which the plain product g * fast is
// clip_mul_exact's own answer, less one: g normal, with an exponent that
// keeps the product at or above 2^-126 whatever the two mantissas (biased
// exponents Eg + Ef >= 128). Above that the product is normal, or past
// f32::MAX the same infinity clip_compose rounds to, or IEEE's answer for
// an infinite or NaN g, as in clip_mul_exact. A zero g is plain too (a zero
// of g's sign: fast is a positive normal number). With the floor derived
// from fast once per run, an element costs three integer operations where
// checking each product's exponent took five, which SwiftShader paid on
// every element of every clip.
fn plain_floor(fast: f32) -> u32 {
    let ef = i32((bitcast<u32>(fast) >> 23u) & 0xffu);
    return (u32(max(1, 128 - ef)) << 23u) - 1u;
}

// A quad's |g| bits minus one, which plain_floor's bound tests: the minus
// one sends a zero to the top of the u32 range, so a zero passes.
fn plain_key(g: vec4<f32>) -> vec4<u32> {
    return (bitcast<vec4<u32>>(g) & vec4(ABS_MASK)) - vec4(1u);
}

// Whether every element of a block is plain (above `lowest`, or zero).
fn block_plain(g: Block, lowest: u32) -> bool {
    return all(min(min(plain_key(g.q0), plain_key(g.q1)), min(plain_key(g.q2), plain_key(g.q3))) >= vec4(lowest));
}

// Invocation t's quads of run [start, start + len): its team's piece of the
// inner quads (team_walk), and for lanes 0 and 1 an edge quad. A multiply
// by a normal factor stores plain products a Block at a time while
// block_plain holds, then a quad at a time while each quad is plain; from
// the first quad that is not (and for the other kinds, or a factor that
// is not normal), every element goes through scaled() (clip_mul_exact)
// one quad at a time.
// Separate loops rather than a branch per block: SIMD CPU drivers
// (SwiftShader) run a branch's body under a lane mask even when no lane
// takes it, so an exact path inside the fast loop cost its full price on
// every block; a loop nobody enters costs one masked pass of its body. The
// exact path is not unrolled: each scaled() is a copy of clip_mul_exact
// once SwiftShader inlines it, and with 24 copies its compiler ran for over
// seven minutes and 4.5 GB without finishing one pipeline.
fn scale_run(start: u32, len: u32, t: u32, kind: u32, fast: f32, m: f32, e: i32) {
    let r = run_of(start, len);
    let w = team_walk(r.inner.y - r.inner.x, t);
    var u = w.first;
    if kind == CLIP_SCALE_MULTIPLY && bitcast<u32>(fast) != 0u {
        let lowest = plain_floor(fast);
        for (; u + 3u * TEAM < w.end; u += 4u * TEAM) {
            let q = r.inner.x + u;
            let g = load_block(q);
            if !block_plain(g, lowest) {
                break;
            }
            store_block(q, Block(g.q0 * fast, g.q1 * fast, g.q2 * fast, g.q3 * fast));
        }
        // The quads short of a block (up to three), or from the block that
        // was not plain, still plain a quad at a time: with four-quad
        // blocks, pieces of a few quads (a small tensor's, clipped per
        // tensor) would otherwise send up to three of them to scaled().
        for (; u < w.end; u += TEAM) {
            let q = r.inner.x + u;
            let g = bitcast<vec4<f32>>(load_quad(q));
            if !all(plain_key(g) >= vec4(lowest)) {
                break;
            }
            store_quad(q, g * fast);
        }
    }
    for (; u < w.end; u += TEAM) {
        let q = r.inner.x + u;
        store_quad(q, scaled_quad(bitcast<vec4<f32>>(load_quad(q)), kind, fast, m, e));
    }
    if t < 2u {
        let ed = edge(r, t);
        if ed.has {
            store_inside(ed.q, r, scaled_quad(bitcast<vec4<f32>>(load_quad(ed.q)), kind, fast, m, e));
        }
    }
}

// A quad's elements through clamped().
fn clamped_quad(g: vec4<f32>, lo: i32, hi: i32) -> vec4<f32> {
    return vec4(clamped(g.x, lo, hi), clamped(g.y, lo, hi), clamped(g.z, lo, hi), clamped(g.w, lo, hi));
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
    let per_tensor = global_kind == CLIP_SCALE_PER_TENSOR;
    // A tensor's factor already encodes NaN/inf handling: an exact
    // multiply by 0 or NaN gives what PyTorch and TensorFlow give.
    let kind = select(global_kind, CLIP_SCALE_MULTIPLY, per_tensor);
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg.x; c < range.y; c += stride) {
        let ch = chunk_at(c);
        var m = stats.state.coef_mant;
        var e = stats.state.coef_exp;
        if per_tensor {
            let st = tensor_stat(ch.tensor);
            m = st.coef_mant;
            e = st.coef_exp;
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
        let r = run_of(ch.start, ch.len);
        let w = team_walk(r.inner.y - r.inner.x, t);
        for (var u = w.first; u < w.end; u += TEAM) {
            let q = r.inner.x + u;
            store_quad(q, clamped_quad(bitcast<vec4<f32>>(load_quad(q)), lo, hi));
        }
        if t < 2u {
            let ed = edge(r, t);
            if ed.has {
                store_inside(ed.q, r, clamped_quad(bitcast<vec4<f32>>(load_quad(ed.q)), lo, hi));
            }
        }
    }
}
