// Reduce pass: each workgroup folds one flat chunk of the gradients into
// one Partial, and, when the clip asks for per-tensor results (entry point
// reduce_tensors), also each of the chunk's segments (one tensor's part of
// it) into one Partial per segment. A chunk's result depends on the chunk
// alone, so the sums are deterministic. The flat partials are computed the
// same way whether or not per-tensor results are asked for, so asking
// cannot move the global norm.
//
// One workgroup per chunk, not workgroups striding over the chunks: a loop
// around the fold's barriers cost lavapipe and llvmpipe GL 40% of the
// reduce (10^7 elements: 6.8 ms against 4.1 without it on lavapipe, 7.3
// against 4.4 on GL; the read roofline at the same shape took 3.9), though
// each workgroup went round it once. The host spreads the chunks over a 2D
// grid where a dimension cannot hold them all (plan::grid).
//
// Every element path walks a run in the same quads (elem_f32.wgsl) and in
// the same order, so native and packed f16 give the same bits, and so do
// f32's vec4 and unaligned files. The quads wholly inside the run are cut
// into one contiguous piece per team (team_walk), and lane l of a team
// takes quads l, l + TEAM, l + 2 TEAM, l + 3 TEAM of each block of
// LANES * TEAM quads of its piece into LANES accumulators (loads in
// flight), the rest one at a time; lanes 0 and 1 also take the run's edge
// quads (which it starts or ends inside), with the elements of other runs
// read as zeros, which no reduction counts.

// Blue's thresholds and scales for f32 (Anderson 2017, adapted so that no
// single square exceeds 2^88 and a bin holds 2^40 of them without overflow).
const TSML_BITS: u32 = 0x20000000u; // 2^-63: below, scale up by 2^86
const TBIG_BITS: u32 = 0x55800000u; // 2^44: at or above, scale down by 2^-84

// Quads each invocation loads per step of the main loop.
const LANES: u32 = 4u;
// Segments up to serial_max() elements are folded by one invocation alone,
// longer ones by the whole workgroup: 8192 on CPU drivers (32 invocations),
// where a workgroup fold's barriers cost more than one invocation reading
// eight thousand elements (tensors of 2 500 elements: per-tensor reduce of
// 2.5 * 10^7 elements 36-43 ms on lavapipe against 64-88 with a bound of
// 2048), 256 on GPUs (256 invocations; CHUNK / LONG_MAX there). Never
// below CHUNK / LONG_MAX, so that a chunk has at most LONG_MAX long
// segments.
const SERIAL_SPAN: u32 = 8388608u; // 2^23: serial_max() = 2^23 / WG^2

fn serial_max() -> u32 {
    return max(SERIAL_SPAN / (WG * WG), CHUNK / LONG_MAX);
}

// Adds one element (its f32 bits; 16-bit inputs are decoded exactly to f32
// first, so one scheme serves every element type) to Blue's three bins.
fn add_l2(acc: ptr<function, vec3<f32>>, flags: ptr<function, u32>, bits: u32) {
    let a = bits & ABS_MASK;
    if a >= EXP_MASK {
        *flags |= nonfinite_flags(a);
    } else if a >= TBIG_BITS {
        let y = bitcast<f32>(a - (84u << 23u)); // |g| * 2^-84, exactly
        (*acc).z += y * y;
    } else if a >= TSML_BITS {
        let y = bitcast<f32>(a);
        (*acc).y += y * y;
    } else if a != 0u {
        // |g| * 2^86 exactly; subnormals are rebuilt from their
        // mantissa (mant * 2^-149 * 2^86) so that no flush loses them.
        let y = select(bitcast<f32>(a + (86u << 23u)), f32(a) * 0x1p-63f, a < MIN_NORMAL_BITS);
        (*acc).x += y * y;
    }
}

// The largest finite |g| so far, by the bits (bit order is value order for
// non-negative floats, so no float compare is needed).
fn add_inf(best: ptr<function, u32>, flags: ptr<function, u32>, bits: u32) {
    let a = bits & ABS_MASK;
    if a >= EXP_MASK {
        *flags |= nonfinite_flags(a);
    } else {
        *best = max(*best, a);
    }
}

fn add_p(acc: ptr<function, vec3<f32>>, flags: ptr<function, u32>, bits: u32, p: f32) {
    let a = bits & ABS_MASK;
    if a >= EXP_MASK {
        *flags |= nonfinite_flags(a);
    } else if a != 0u {
        *acc = merge_p(*acc, p_self(a), p);
    }
}

// The p-sum (s, m, E) of one finite, non-zero element of |g| bits a: its
// own term, 1, relative to itself.
fn p_self(a: u32) -> vec3<f32> {
    let d = decode(a);
    return vec3(1.0, d.m, f32(d.e));
}

// Folds one element (its f32 bits) into a reduction of the given kind
// (0 = L2, 1 = Inf with the max's bits kept in acc.x, 2 = general p). The
// kind is the pipeline override KIND, so compilers drop the other arms.
fn add_element(kind: u32, acc: ptr<function, vec3<f32>>, flags: ptr<function, u32>, bits: u32) {
    switch kind {
        case 0u: {
            add_l2(acc, flags, bits);
        }
        case 1u: {
            var best = bitcast<u32>((*acc).x);
            add_inf(&best, flags, bits);
            (*acc).x = bitcast<f32>(best);
        }
        default: {
            add_p(acc, flags, bits, cfg.p);
        }
    }
}

// Quad q's bits, with the elements outside run r as zeros.
fn quad_in(q: u32, r: Run) -> vec4<u32> {
    let i = vec4(4u * q) + vec4(0u, 1u, 2u, 3u);
    let inside = (i >= vec4(r.start)) & (i < vec4(r.end));
    return select(vec4(0u), load_quad(q), inside);
}

// The quads of a run one invocation folds: [first, end) in steps of
// stride, and the run's edge quads k with edges[k]. A workgroup's
// invocations each take a team's share (team_share); a short segment is
// one invocation's whole share (whole_share).
struct Share {
    first: u32,
    end: u32,
    stride: u32,
    edges: vec2<bool>,
}

// Invocation t's share of run r in a workgroup fold: its team's piece of
// the inner quads, lane by lane (team_walk); lanes 0 and 1 take the edges.
fn team_share(r: Run, t: u32) -> Share {
    let w = team_walk(r.inner.y - r.inner.x, t);
    return Share(r.inner.x + w.first, r.inner.x + w.end, TEAM, vec2(t == 0u, t == 1u));
}

// All of run r, for one invocation alone.
fn whole_share(r: Run) -> Share {
    return Share(r.inner.x, r.inner.y, 1u, vec2(true, true));
}

// Edge quad k of run r if the share takes it (zeros otherwise).
fn edge_bits(r: Run, sh: Share, k: u32) -> vec4<u32> {
    let e = edge(r, k);
    if sh.edges[k] && e.has {
        return quad_in(e.q, r);
    }
    return vec4(0u);
}

fn add_quad(kind: u32, acc: ptr<function, vec3<f32>>, flags: ptr<function, u32>, b: vec4<u32>) {
    add_element(kind, acc, flags, b.x);
    add_element(kind, acc, flags, b.y);
    add_element(kind, acc, flags, b.z);
    add_element(kind, acc, flags, b.w);
}

// The exact fold of a share of run r, element by element: Blue's bins, the
// max's bits, or the scaled p-sum, with the FLAG_* bits. The slow path, for
// what the fast paths cannot take. The shader compilers inline every call,
// and this function is inlined at up to six places in a per-tensor
// pipeline, so the edge quads go through one add_element in a loop rather
// than eight written out: SwiftShader compiled the tracked per-tensor
// pipelines a third faster. The share's own quads keep theirs written
// out: a loop there cost the exact path 14% on lavapipe, and one loop for
// edges and quads alike (a branch per quad) 45% on SwiftShader.
fn exact_quads(r: Run, sh: Share, kind: u32) -> Partial {
    var acc = vec3<f32>(0.0);
    var flags = 0u;
    for (var k = 0u; k < 2u; k++) {
        let b = edge_bits(r, sh, k);
        for (var i = 0u; i < 4u; i++) {
            add_element(kind, &acc, &flags, b[i]);
        }
    }
    for (var q = sh.first; q < sh.end; q += sh.stride) {
        add_quad(kind, &acc, &flags, load_quad(q));
    }
    return Partial(acc, flags);
}

// The fast L2 path's window for a share's plain sum of squares, on its
// bits. At or above 2^-79: every element whose square leaves the normal
// range below (|g| < 2^-63, which Blue's small bin would have scaled up,
// and a flushing driver drops) adds less than 2^-126, under 2^-30 of the
// sum all told for a chunk's at most 2^17 elements, far below f32's own
// rounding. Below 2^96: finite, so no square overflowed, and finalize's
// sum of up to 2^25 chunks' bins stays finite. Squares of big elements
// round like any others, so inside the window the plain sum is as accurate
// as Blue's bins, with one multiply-add per element instead of Blue's
// per-element band checks.
const L2_SUM_MIN_BITS: u32 = 0x18000000u; // 2^-79
const L2_SUM_MAX_BITS: u32 = 0x6f800000u; // 2^96

fn in_l2_window(sum: f32) -> bool {
    let bits = bitcast<u32>(sum);
    return bits >= L2_SUM_MIN_BITS && bits < L2_SUM_MAX_BITS;
}

// L2 of a share of run r. Fast path: plain squares in LANES accumulators,
// kept when their sum lies in the window above (what every element in
// Blue's medium band, and most chunks of real gradients, give); a share
// of zeros is recognised by its largest element; anything else (non-finite
// elements, sums out of the window) is redone exactly.
fn l2_quads(r: Run, sh: Share) -> Partial {
    return l2_accept(r, sh, plain_quads(r, sh));
}

// The plain walk's values of a quad's bits: the elements for L2 (a
// square needs no sign), their magnitudes for an integer p.
fn plain_value(b: vec4<u32>) -> vec4<f32> {
    if KIND == 0u {
        return bitcast<vec4<f32>>(b);
    }
    return bitcast<vec4<f32>>(b & vec4(ABS_MASK));
}

// What a plain term multiplies its value by: the value for L2 (a square),
// its (POWER - 1)th power for an integer p (POWER - 2 multiplies). The
// walks add a term as fma(term_base(z), z, s): one rounding, pinned.
// plain_tracked adds the same quads to the same accumulators and uses
// each term once more, which must not change how a compiler contracts
// them, or the global result would depend on asking for per-tensor
// results.
//
// Written out to MAX_POWER, each step under a condition on the override
// that specialisation makes constant, rather than as a loop to POWER:
// SwiftShader's Subzero JIT does not unroll loops, so the loop's test and
// branch ran for every quad (p = 3, 10^7 elements: the plain reduce
// 37-39 ms against L2's 17-18; unrolled 21-22).
fn term_base(z: vec4<f32>) -> vec4<f32> {
    if KIND == 0u {
        return z;
    }
    var y = select(z, vec4(1.0), POWER <= 1u);
    if POWER > 2u {
        y *= z;
    }
    if POWER > 3u {
        y *= z;
    }
    if POWER > 4u {
        y *= z;
    }
    if POWER > 5u {
        y *= z;
    }
    if POWER > 6u {
        y *= z;
    }
    if POWER > 7u {
        y *= z;
    }
    return y;
}

// A quad's plain terms: z^2, or z^POWER (POWER - 1 multiplies, each
// within half an ulp).
fn plain_term(z: vec4<f32>) -> vec4<f32> {
    return term_base(z) * z;
}

// The sum of a quad's plain terms, for a segment's running sum in the
// tracked walk: squares, or an integer p's powers (a general p's terms
// are p_terms, in seg_add).
fn seg_term(z: vec4<f32>) -> f32 {
    if KIND == 0u {
        return dot(z, z);
    }
    return plain_sum(plain_term(z));
}

// The plain terms of a main-loop step's quads z0..z3, added quad after
// quad in each of the four element positions: what a step adds to its
// share's sum, and in the tracked walk (its plain_sum) to a segment's. One
// sum a share, not one per quad of a step: with LANES vec4 accumulators
// the tracked walk also summed each step's terms apart for the segment (a
// dot product per quad), twice the arithmetic and live values of the
// plain walk.
fn step_terms(z0: vec4<f32>, z1: vec4<f32>, z2: vec4<f32>, z3: vec4<f32>) -> vec4<f32> {
    return fma(term_base(z3), z3, fma(term_base(z2), z2, fma(term_base(z1), z1, plain_term(z0))));
}

// The sum a share's walk starts from: the terms of its edge quads (zeros
// for a share without them).
fn edge_terms(r: Run, sh: Share) -> vec4<f32> {
    let e1 = plain_value(edge_bits(r, sh, 1u));
    return fma(term_base(e1), e1, plain_term(plain_value(edge_bits(r, sh, 0u))));
}

// The plain terms of a share of run r, summed: the walk of l2_quads and
// p_quads for an integer p. The edge quads' terms first, each main-loop
// step's step_terms, then the quads after the last whole step one at a
// time. The main loop loads two steps' quads before it adds either, 2
// LANES loads in flight, and adds the steps in order, so the sum takes the
// same terms in the same order as a step at a time (the tracked walk's and
// the unit walk's, which must give the same bits). SwiftShader's fastest
// read roofline keeps eight loads in flight: there the no-clip L2 step
// took 3-10% less time with two steps a loop (10^7 and 2.5 10^7 elements,
// one tensor and 10^4), lavapipe 9-11% less at 10^7 and the same at 2.5
// 10^7, llvmpipe GL the same. max_quads does the same.
fn plain_quads(r: Run, sh: Share) -> vec4<f32> {
    var s = edge_terms(r, sh);
    let st = sh.stride;
    var q = sh.first;
    for (; q + (2u * LANES - 1u) * st < sh.end; q += 2u * LANES * st) {
        let z0 = plain_value(load_quad(q));
        let z1 = plain_value(load_quad(q + st));
        let z2 = plain_value(load_quad(q + 2u * st));
        let z3 = plain_value(load_quad(q + 3u * st));
        let z4 = plain_value(load_quad(q + 4u * st));
        let z5 = plain_value(load_quad(q + 5u * st));
        let z6 = plain_value(load_quad(q + 6u * st));
        let z7 = plain_value(load_quad(q + 7u * st));
        let a = step_terms(z0, z1, z2, z3);
        let b = step_terms(z4, z5, z6, z7);
        s += a;
        s += b;
    }
    for (; q + (LANES - 1u) * st < sh.end; q += LANES * st) {
        let z0 = plain_value(load_quad(q));
        let z1 = plain_value(load_quad(q + st));
        let z2 = plain_value(load_quad(q + 2u * st));
        let z3 = plain_value(load_quad(q + 3u * st));
        s += step_terms(z0, z1, z2, z3);
    }
    for (; q < sh.end; q += st) {
        let z = plain_value(load_quad(q));
        s = fma(term_base(z), z, s);
    }
    return s;
}

fn plain_sum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

// The L2 partial of a share of run r whose plain squares summed to v.
fn l2_accept(r: Run, sh: Share, v: vec4<f32>) -> Partial {
    let sum = plain_sum(v);
    if in_l2_window(sum) {
        return Partial(vec3(0.0, sum, 0.0), 0u);
    }
    if bitcast<u32>(sum) == 0u && max_quads(r, sh) == 0u {
        return Partial(vec3(0.0), 0u);
    }
    return exact_quads(r, sh, 0u);
}

fn max4(a: vec4<u32>) -> u32 {
    return max(max(a.x, a.y), max(a.z, a.w));
}

// The largest |g| bits of a share of run r, two main-loop steps a loop as
// in plain_quads (a max takes any order). On the host of the thirty-third
// session Inf gained nothing from that; on the forty-ninth's (a 2-core
// EPYC) SwiftShader's Inf reduce took 5-10% less time (10^7 elements, one
// tensor: 14.8-16.8 ms -> 13.7-14.6), lavapipe and llvmpipe GL the same.
fn max_quads(r: Run, sh: Share) -> u32 {
    var m = max(edge_bits(r, sh, 0u) & vec4(ABS_MASK), edge_bits(r, sh, 1u) & vec4(ABS_MASK));
    let st = sh.stride;
    var q = sh.first;
    for (; q + (2u * LANES - 1u) * st < sh.end; q += 2u * LANES * st) {
        let a = abs_block(q, st);
        let b = abs_block(q + LANES * st, st);
        m = max(m, max(block_max(a), block_max(b)));
    }
    for (; q + (LANES - 1u) * st < sh.end; q += LANES * st) {
        m = max(m, block_max(abs_block(q, st)));
    }
    for (; q < sh.end; q += st) {
        m = max(m, load_quad(q) & vec4(ABS_MASK));
    }
    return max4(m);
}

// Inf of a share of run r: the max of the bits, exact as it is; the
// element-wise path only to sort out the flags of non-finite elements.
fn inf_quads(r: Run, sh: Share) -> Partial {
    return inf_accept(r, sh, max_quads(r, sh));
}

// The Inf partial of a share of run r whose largest |g| bits are best.
fn inf_accept(r: Run, sh: Share, best: u32) -> Partial {
    if best < EXP_MASK {
        return Partial(vec3(bitcast<f32>(best), 0.0, 0.0), 0u);
    }
    return exact_quads(r, sh, 1u);
}

// |g|^p relative to a reference r = m * 2^e (log2_m = log2(m)): one log2
// and one exp2, the mantissas' logs differenced before the exponents'
// difference is added, as merge_p does. Zero gives 0, by a select rather
// than a branch (which CPU drivers would run for every element anyway).
fn p_term(a: u32, log2_m: f32, e: i32, p: f32) -> f32 {
    let d = decode(a);
    return select(exp2(p * ((log2(d.m) - log2_m) + f32(d.e - e))), 0.0, a == 0u);
}

fn p_terms(a: vec4<u32>, log2_m: f32, e: i32, p: f32) -> vec4<f32> {
    return vec4(p_term(a.x, log2_m, e, p), p_term(a.y, log2_m, e, p), p_term(a.z, log2_m, e, p), p_term(a.w, log2_m, e, p));
}

// The |g| bits a general p-sum is taken relative to, decoded as p_term
// wants them.
struct PRef {
    bits: u32,
    log2_m: f32,
    e: i32,
}

fn p_ref(bits: u32) -> PRef {
    let d = decode(bits);
    return PRef(bits, log2(d.m), d.e);
}

// p * log2(b / r): the log2 of b's term relative to r.
fn p_log_ratio(b: PRef, r: PRef, p: f32) -> f32 {
    return p * ((b.log2_m - r.log2_m) + f32(b.e - r.e));
}

// How far a general p-sum's terms may grow past its reference, as log2:
// the reference moves up to the running maximum when an element passes
// p_limit, about 2^(P_REF_SPAN / p) times the reference, and the sums are
// rescaled then. No term or sum overflows (the largest sum is 2^17
// elements of about 2^32), and a rescale's rounding is lost: what it
// scales (at most 2^17 terms of at most about 1) is under 2^-15 of the new
// maximum's own term.
const P_REF_SPAN: f32 = 32.0;

// A general p-sum's reference for running maximum `top`, from the old one
// `r`: top's when top's term relative to r passes 2^P_REF_SPAN, with the
// factor that rescales the sums to it (else r, and exactly 1). Straight
// line: a branch would cost the CPU drivers its body on every call.
struct PStep {
    r: PRef,
    k: f32,
}

fn p_step(top: u32, r: PRef, p: f32) -> PStep {
    let t = p_ref(top);
    let d = p_log_ratio(t, r, p);
    let moves = d > P_REF_SPAN;
    let to = PRef(select(r.bits, t.bits, moves), select(r.log2_m, t.log2_m, moves), select(r.e, t.e, moves));
    return PStep(to, select(1.0, exp2(-d), moves));
}

// Moves a general p-sum's reference *rf to running maximum top's and
// returns the factor that rescales the sums to it.
fn p_move(rf: ptr<function, PRef>, top: u32, p: f32) -> f32 {
    let t = p_ref(top);
    let k = exp2(-p_log_ratio(t, *rf, p));
    *rf = t;
    return k;
}

// The largest |g| bits whose term relative to r stays within about
// 2^P_REF_SPAN: r * 2^(P_REF_SPAN / p), rounded down to r's own bits where
// that is subnormal (r's neighbourhood then moves the reference at every
// rise, which costs time, never accuracy) and to f32::MAX past the normal
// range. Never below r, so every move raises the reference.
fn p_limit(r: PRef, p: f32) -> u32 {
    let l = (f32(r.e) + r.log2_m) + P_REF_SPAN / p;
    let f = floor(l);
    let e = i32(clamp(f, -127.0, 128.0));
    let bits = (u32(clamp(e + 127, 1, 254)) << 23u) | (bitcast<u32>(exp2(l - f)) & MANT_MASK);
    let capped = select(bits, 0x7f7fffffu, e >= 128);
    return max(select(capped, r.bits, e < -126), r.bits);
}

// The integer p this reduce pipeline is specialised for, 1 to
// MAX_POWER, injected by the host (0: general p, and every pipeline of
// KIND 0 and 1). With it, a term is powered by POWER - 1 multiplies,
// written out in term_base: a power chosen per element at run time (a
// loop or a select of x, x^2, x^4) cost lavapipe a third more time than
// the whole L2 reduce.
override POWER: u32 = 0u;

// Largest POWER, the number of steps term_base writes out
// (shaders::MAX_POWER on the host, checked against this by the tests).
const MAX_POWER: u32 = 8u;

// The p-sum for p = POWER of a share of run r whose plain powers of |g|
// (POWER - 1 multiplies each: plain_quads, or plain_tracked, which adds
// the same terms) summed to v. Kept when the sum is at least 2^-79, for
// l2_quads's reason (terms that left the normal range add under 2^-30 of
// it), and finite: then no term overflowed. Else, or for a share of zeros,
// p_general redoes the share, as l2_accept hands the same cases on to
// exact_quads. A p-sum is (s, m, E) with s = sum / (m * 2^E)^p for any reference at or
// below the norm (merge_p and finalize take any; s >= 1 keeps the sum in
// range). Here the reference is 2^E with E = floor(e / POWER) for the
// sum's exponent e, so s = sum * 2^(-POWER * E), in [1, 2^POWER), is exact
// exponent arithmetic: no largest element to track (a float max per
// element, a fifth of the loop's work), and no division.
fn p_int_accept(r: Run, sh: Share, v: vec4<f32>) -> Partial {
    let direct = p_int_partial(plain_sum(v));
    if direct.v.x != 0.0 {
        return direct;
    }
    return p_general(r, sh);
}

// The p-sum of plain terms that summed to `sum`, or a zero sum where
// p_int_accept does not keep it.
fn p_int_partial(sum: f32) -> Partial {
    let bits = bitcast<u32>(sum);
    if bits < L2_SUM_MIN_BITS || bits >= EXP_MASK {
        return Partial(vec3(0.0), 0u);
    }
    let e = i32(bits >> 23u) - 127;
    let n = i32(max(POWER, 1u)); // 0 (general p) never gets here; a constant divisor of 0 would not compile
    let ref_e = select(e / n, (e - n + 1) / n, e < 0);
    return Partial(vec3(mul_pow2(sum, -n * ref_e), 1.0, f32(ref_e)), 0u);
}

// Where a general p walk of a share of run r starts: its edge quads'
// largest bits, the reference they give and their terms relative to it
// (in the first two accumulators).
struct PStart {
    top: u32,
    rf: PRef,
    s0: vec4<f32>,
    s1: vec4<f32>,
}

fn p_start(r: Run, sh: Share) -> PStart {
    let e0 = edge_bits(r, sh, 0u) & vec4(ABS_MASK);
    let e1 = edge_bits(r, sh, 1u) & vec4(ABS_MASK);
    let top = max4(max(e0, e1));
    let rf = p_ref(top);
    return PStart(top, rf, p_terms(e0, rf.log2_m, rf.e, cfg.p), p_terms(e1, rf.log2_m, rf.e, cfg.p));
}

// A general p walk's state (p_general): the running maximum of the |g|
// bits, the reference, the limit past which a step moves it (p_limit)
// and the four accumulators of terms relative to it.
struct PWalk {
    top: u32,
    rf: PRef,
    lim: u32,
    s0: vec4<f32>,
    s1: vec4<f32>,
    s2: vec4<f32>,
    s3: vec4<f32>,
}

fn p_walk(r: Run, sh: Share) -> PWalk {
    let w = p_start(r, sh);
    return PWalk(w.top, w.rf, p_limit(w.rf, cfg.p), w.s0, w.s1, vec4(0.0), vec4(0.0));
}

// LANES quads of a step of a walk, as bits.
struct QuadBlock {
    b0: vec4<u32>,
    b1: vec4<u32>,
    b2: vec4<u32>,
    b3: vec4<u32>,
}

// The |g| bits of the main-loop step at quad q, stride st.
fn abs_block(q: u32, st: u32) -> QuadBlock {
    let abs4 = vec4(ABS_MASK);
    return QuadBlock(load_quad(q) & abs4, load_quad(q + st) & abs4, load_quad(q + 2u * st) & abs4, load_quad(q + 3u * st) & abs4);
}

// A step's largest bits by element position (max_quads' accumulator),
// and over all of them.
fn block_max(b: QuadBlock) -> vec4<u32> {
    return max(max(b.b0, b.b1), max(b.b2, b.b3));
}

fn block_top(b: QuadBlock) -> u32 {
    return max4(block_max(b));
}

// Adds a step's |g| bits b, largest bt (within the limit), to walk w;
// returns the step's terms, summed by lane of the quads (p_tracked's
// segment takes them too).
fn p_walk_add(w: ptr<function, PWalk>, b: QuadBlock, bt: u32) -> vec4<f32> {
    let p = cfg.p;
    let rf = (*w).rf;
    (*w).top = max((*w).top, bt);
    let t0 = p_terms(b.b0, rf.log2_m, rf.e, p);
    let t1 = p_terms(b.b1, rf.log2_m, rf.e, p);
    let t2 = p_terms(b.b2, rf.log2_m, rf.e, p);
    let t3 = p_terms(b.b3, rf.log2_m, rf.e, p);
    (*w).s0 += t0;
    (*w).s1 += t1;
    (*w).s2 += t2;
    (*w).s3 += t3;
    return (t0 + t1) + (t2 + t3);
}

// Moves walk w's reference up to its running maximum with a step's
// largest bits `passed` (past the limit), rescales the sums and returns
// the factor it rescaled them by (for a caller's own sums). Where that
// maximum is not finite it moves nothing and returns 1: the walk ends
// there, and p_walk_finish hands the share to exact_quads.
fn p_walk_rise(w: ptr<function, PWalk>, passed: u32) -> f32 {
    let p = cfg.p;
    (*w).top = max((*w).top, passed);
    if (*w).top >= EXP_MASK {
        return 1.0;
    }
    var rf = (*w).rf;
    let k = p_move(&rf, (*w).top, p);
    (*w).rf = rf;
    (*w).lim = p_limit(rf, p);
    (*w).s0 *= k;
    (*w).s1 *= k;
    (*w).s2 *= k;
    (*w).s3 *= k;
    return k;
}

// Adds one quad's |g| bits b to walk w, short of a step: the reference
// follows the running maximum at once (p_step). Returns the factor that
// rescaled the sums (1 where the reference stayed).
fn p_walk_quad(w: ptr<function, PWalk>, b: vec4<u32>) -> f32 {
    let p = cfg.p;
    (*w).top = max((*w).top, max4(b));
    let step = p_step((*w).top, (*w).rf, p);
    let rf = step.r;
    (*w).rf = rf;
    (*w).s0 = (*w).s0 * step.k + p_terms(b, rf.log2_m, rf.e, p);
    (*w).s1 *= step.k;
    (*w).s2 *= step.k;
    (*w).s3 *= step.k;
    return step.k;
}

// Walk w's quads from q0 to the share's end one at a time (those short of
// a step), then its p-sum (p_finish). A walk that met a non-finite
// element skips them: exact_quads redoes the share.
fn p_walk_finish(r: Run, sh: Share, w0: PWalk, q0: u32) -> Partial {
    var w = w0;
    for (var q = select(sh.end, q0, w.top < EXP_MASK); q < sh.end; q += sh.stride) {
        p_walk_quad(&w, load_quad(q) & vec4(ABS_MASK));
    }
    return p_finish(r, sh, w.top, w.rf, (w.s0 + w.s1) + (w.s2 + w.s3));
}

// General p of a share of run r, in one pass: every term relative to a
// reference that follows the running maximum (p_limit, p_step), so the sum
// never over- or underflows, at the price of a decode, one log2 and one
// exp2 per element, and a compare per four quads against the reference's
// limit. (A first pass for the maximum took 28% of the CPU drivers'
// time.) The sum is
// returned relative to the share's largest element: s >= 1 (that
// element's own term).
fn p_general(r: Run, sh: Share) -> Partial {
    var w = p_walk(r, sh);
    let st = sh.stride;
    var q = sh.first;
    // Steps whose elements all stay within the limit add their terms to a
    // fixed reference; a step that passes it leaves the inner loop, moves
    // the reference to the running maximum and goes back in at the same
    // step, which the new limit admits (p_limit never falls below the
    // reference, here at least the step's largest bits). A move in the
    // inner loop, even one no element makes, cost every step a log2 and an
    // exp2 on the CPU drivers, which run any straight-line step in full.
    loop {
        var passed = 0u;
        for (; q + (LANES - 1u) * st < sh.end; q += LANES * st) {
            let b = abs_block(q, st);
            let bt = block_top(b);
            if bt > w.lim {
                passed = bt;
                break;
            }
            p_walk_add(&w, b, bt);
        }
        if passed == 0u {
            break;
        }
        p_walk_rise(&w, passed);
        if w.top >= EXP_MASK {
            break;
        }
    }
    return p_walk_finish(r, sh, w, q);
}

// The p-sum of a share of run r whose general p walk (p_general,
// p_tracked) ended with largest |g| bits top, reference rf and the terms
// relative to rf summed to v.
fn p_finish(r: Run, sh: Share, top: u32, rf: PRef, v: vec4<f32>) -> Partial {
    if top >= EXP_MASK {
        return exact_quads(r, sh, 2u);
    }
    if top == 0u {
        return Partial(vec3(0.0), 0u);
    }
    // Relative to the largest element: at least its own term, 1, which a
    // rounding of the rescale must not take below.
    let d = decode(top);
    let k = select(exp2(-p_log_ratio(PRef(top, log2(d.m), d.e), rf, cfg.p)), 1.0, top == rf.bits);
    return Partial(vec3(max(plain_sum(v) * k, 1.0), d.m, f32(d.e)), 0u);
}

// The partial of a share of run r whose plain terms (squares for L2, an
// integer p's powers) summed to v: l2_accept or p_int_accept.
fn plain_accept(r: Run, sh: Share, v: vec4<f32>) -> Partial {
    if KIND == 0u {
        return l2_accept(r, sh, v);
    }
    return p_int_accept(r, sh, v);
}

// The p-sum of a share of run r: an integer p tries its plain powers first.
fn p_quads(r: Run, sh: Share) -> Partial {
    if POWER != 0u {
        return p_int_accept(r, sh, plain_quads(r, sh));
    }
    return p_general(r, sh);
}

// A share of the run [start, start + len) under the kind.
fn share_fold(r: Run, sh: Share, kind: u32) -> Partial {
    switch kind {
        case 0u: {
            return l2_quads(r, sh);
        }
        case 1u: {
            return inf_quads(r, sh);
        }
        default: {
            return p_quads(r, sh);
        }
    }
}

// The whole workgroup's fold of a run, as fold_shares leaves it.
fn workgroup_fold(start: u32, len: u32, t: u32, kind: u32) {
    let r = run_of(start, len);
    fold_shares(t, share_fold(r, team_share(r, t), kind), kind);
}

// Per-tensor results from the flat walk's own loads. A second walk over a
// chunk, segment by segment, cost CPU drivers as much as the flat walk
// (their loads, not memory, are the limit: 10^4 tensors of 10^3 elements,
// reduce_tensors 8.4 ms against reduce's 4.1 on lavapipe). So where a
// chunk's segments fit in seg_slots and none inside it is shorter than a
// block (tracked_round), reduce_tensors folds L2, Inf and integer p
// segments during the flat walk: each lane keeps the plain sum of squares
// or powers (or the largest bits) of the segment its quads are in and,
// having left it, stores it in the segment's slot for that lane and team.
// A segment's slots are then folded team by team and lane by lane, its
// elements in the chunk's edge quads last: a fixed order, so the result is
// deterministic. It is kept where l2_accept or p_int_accept would keep a
// plain sum (the same window, for the same reason); zero sums, sums out of
// the window and non-finite elements go to the element-wise and
// per-segment paths below. The flat walk itself adds the same quads to the
// same accumulators as plain_quads and max_quads, so the global result
// keeps its bits. A general p's walk (p_tracked) keeps each lane's terms
// relative to the walk's reference, which follows the lane's running
// maximum, and the largest bits of the segment's elements with them: its
// slot is that sum taken relative to the segment's own largest element,
// kept where the reference had not risen far above it (p_slot).

// Slots in rows of TEAM: a chunk of S segments needs S + WG / TEAM - 1
// rows (row (s - first segment) + team, one per segment a team's piece
// holds elements of; consecutive pieces share at most one segment). 1536
// words take 6 KiB of workgroup memory, which with the rest of the
// reduce's fits WebGPU's 16 KiB at 256 invocations: on GPUs (TEAM 8) 192
// rows, for chunks of up to 161 segments (32 768 elements: 200 on
// average); on CPU drivers (TEAM 1, 32 invocations) 1536 rows, for up to
// 1505 (131 072 elements: 87). A general p's slots take two words
// (slot_words), so half as many rows: up to 65 segments on GPUs, 737 on
// CPU drivers.
const SLOT_WORDS: u32 = 1536u;
var<workgroup> seg_slots: array<u32, SLOT_WORDS>;

// Whether this pipeline's reduction is a general (not integer) p.
fn general_p() -> bool {
    return KIND == 2u && POWER == 0u;
}

// Words of a general p's slot: its sum and its largest bits
// (shaders::GENERAL_P_SLOT_WORDS on the host, checked by the tests).
const P_SLOT_WORDS: u32 = 2u;

// Words of a slot: the sum (or largest bits) alone but for a general p.
fn slot_words() -> u32 {
    return select(1u, P_SLOT_WORDS, general_p());
}

// Whether this reduce_tensors pipeline folds segments in the flat walk at
// all, injected by the host (shaders::TRACK_OVERRIDE): off for sets whose
// chunks each hold one segment. (It was off on SwiftShader, whose Subzero
// JIT ran the walk that stopped each lane at its own segment end slower
// than two walks: 10^4 tensors of 10^3 elements, reduce_tensors 32 ms
// against 25. The walk in rounds is faster there too.)
override TRACK: bool = true;

// Whether reduce_tensors folds the segments [segs.x, segs.y) of a chunk
// in its flat walk (a uniform choice: it depends on the plan alone).
fn tracks_segments(segs: vec2<u32>) -> bool {
    return TRACK && segs.y - segs.x > 1u && (segs.y - segs.x) + WG / TEAM - 1u <= SLOT_WORDS / (TEAM * slot_words());
}

// The first word of segment s's slot for a lane of a team.
fn slot(segs: vec2<u32>, s: u32, team: u32, lane: u32) -> u32 {
    return (((s - segs.x) + team) * TEAM + lane) * slot_words();
}

// The segment of [segs.x, segs.y) that holds window element e (the last
// that starts at or before it).
fn segment_of(segs: vec2<u32>, e: u32) -> u32 {
    var lo = segs.x;
    var hi = segs.y;
    while hi - lo > 1u {
        let mid = (lo + hi) / 2u;
        if plan[3u * mid] <= e {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// A lane's place in the chunk's segments during the tracked walk: segment
// s, holding elements [lo, hi), with its sum of squares or powers (L2,
// p) or largest bits (Inf, general p) so far; a general p's sum is of
// terms relative to rf, the walk's reference. The lane's team stores a
// slot for each segment of its piece, up to `last`.
struct SegTrack {
    segs: vec2<u32>,
    team: u32,
    lane: u32,
    s: u32,
    last: u32,
    lo: u32,
    hi: u32,
    sum: f32,
    top: vec4<u32>,
    rf: PRef,
}

// Invocation t's track through the segments segs of run r (a flat chunk).
fn seg_track(r: Run, segs: vec2<u32>, t: u32) -> SegTrack {
    let team = t / TEAM;
    let piece = team_piece(r.inner.y - r.inner.x, team) + vec2(r.inner.x);
    var tr = SegTrack(segs, team, t % TEAM, 1u, 0u, 0u, 0u, 0.0, vec4(0u), PRef(0u, 0.0, 0));
    if piece.x < piece.y {
        tr.s = segment_of(segs, 4u * piece.x);
        tr.last = segment_of(segs, 4u * piece.y - 1u);
        let sg = chunk_at(tr.s);
        tr.lo = sg.start;
        tr.hi = sg.start + sg.len;
    }
    return tr;
}

// Adds the elements of bits b that `keep` selects to the current segment.
fn seg_add(tr: ptr<function, SegTrack>, b: vec4<u32>, keep: vec4<bool>) {
    let a = select(vec4(0u), b & vec4(ABS_MASK), keep);
    if KIND == 1u || general_p() {
        (*tr).top = max((*tr).top, a);
    }
    if general_p() {
        let rf = (*tr).rf;
        (*tr).sum += plain_sum(p_terms(a, rf.log2_m, rf.e, cfg.p));
    } else if KIND != 1u {
        (*tr).sum += seg_term(bitcast<vec4<f32>>(a));
    }
}

// Stores segment t.s's slot for t's lane and team.
fn seg_store(t: SegTrack) {
    let i = slot(t.segs, t.s, t.team, t.lane);
    if general_p() {
        let w = p_slot(t);
        seg_slots[i] = w.x;
        seg_slots[i + 1u] = w.y;
        return;
    }
    var v = max4(t.top);
    if KIND != 1u {
        v = bitcast<u32>(t.sum);
    }
    seg_slots[i] = v;
}

// A general p's slot of a lane's part of a segment: the sum of its terms
// relative to its largest element, whose bits follow (zeros for a part of
// zeros). The walk's terms are relative to its reference, which may have
// risen past the part's largest element: the part is marked (largest bits
// EXP_MASK, for the per-segment paths) where that element's term is below
// 2^-P_REF_SPAN of the reference (the part's terms then lose to the
// reference's range what p_general, relative to the segment's own
// maximum, keeps), where the walk met a non-finite element (its reference
// then is one) and where the sum is short of that element's own term (a
// rounding never takes it below half).
fn p_slot(t: SegTrack) -> vec2<u32> {
    let top = max4(t.top);
    let d = p_log_ratio(p_ref(top), t.rf, cfg.p);
    let s = t.sum * exp2(-d);
    let bad = t.rf.bits >= EXP_MASK || top >= EXP_MASK || !(d >= -P_REF_SPAN) || !(s >= 0.5);
    let part = vec2(bitcast<u32>(max(s, 1.0)), select(top, EXP_MASK, bad));
    return select(part, vec2(0u, select(0u, EXP_MASK, t.rf.bits >= EXP_MASK)), top == 0u);
}

// A general p's slot words w as a p-sum (s, m, E), zeros for a part of
// zeros.
fn p_slot_sum(w: vec2<u32>) -> vec3<f32> {
    let d = decode(w.y);
    return select(vec3(bitcast<f32>(w.x), d.m, f32(d.e)), vec3(0.0), w.y == 0u);
}

// Stores the current segment's slot and moves to the next segment.
fn seg_flush(tr: ptr<function, SegTrack>) {
    let t = *tr;
    seg_store(t);
    (*tr).sum = 0.0;
    (*tr).top = vec4(0u);
    (*tr).s = t.s + 1u;
    if t.s < t.last {
        let sg = chunk_at(t.s + 1u);
        (*tr).lo = sg.start;
        (*tr).hi = sg.start + sg.len;
    }
}

// Adds quad q (bits b) to the segments holding its elements, storing each
// that ends inside it. The quads of a lane come in ascending order, so
// none of their elements lies before the current segment.
fn seg_take(tr: ptr<function, SegTrack>, b: vec4<u32>, q: u32) {
    let i = vec4(4u * q) + vec4(0u, 1u, 2u, 3u);
    while (*tr).hi < 4u * q + 4u && (*tr).s < (*tr).last {
        seg_add(tr, b, (i >= vec4((*tr).lo)) & (i < vec4((*tr).hi)));
        seg_flush(tr);
    }
    seg_add(tr, b, i >= vec4((*tr).lo));
}

// Stores the slots of the lane's remaining segments (zeros for those its
// quads skipped).
fn seg_finish(tr: ptr<function, SegTrack>) {
    while (*tr).s <= (*tr).last {
        seg_flush(tr);
    }
}

// The tracked walk goes in rounds of the same number of main-loop steps
// for every lane. A step's sum of terms (or largest bits) goes to the
// lane's current segment when the step ends at or before the segment's
// end, to the next segment when it starts at or after it, and to neither
// when the end falls inside it. At a round's end a lane that has passed
// its segment's end splits that crossing step between the two element by
// element (its quads read again, from cache), stores the segment and
// moves on. A walk that stopped each lane at its own segment's end kept
// the lanes of a CPU driver's SIMD group waiting for the one whose end was
// furthest (10^4 tensors of 10^3 elements on lavapipe: the tracked walk
// took 45% longer than the plain one). A round spans at most one segment
// end per lane where no segment inside the chunk is shorter than the
// round (tracked_round).

// Elements of a block: the quads all lanes of a team take in one main-loop
// step.
fn block_elements() -> u32 {
    return 4u * LANES * TEAM;
}

// Main-loop steps per round of the tracked walk over flat chunk c: whole
// blocks of the shortest segment inside it (the plan's gap; the chunk's
// first and last segments may run past it), at most a chunk's. 0 where
// that one is shorter than a block: then a step could hold two segment
// ends, and the chunk is not tracked.
fn tracked_round(c: u32) -> u32 {
    return min(chunk_gap(c), CHUNK) / block_elements();
}

// No crossing step in a round.
const NO_STEP: u32 = 0xffffffffu;

// The main-loop steps of quads q + k * st against element e, as bounds
// on q: a step ends at or before e where q < x, starts at or after it
// where q >= y, and holds it in between. Found once a round, with the
// crossing step after it (crossing_step), so that a step costs the walk
// two compares: SwiftShader's Subzero JIT hoists nothing, and with the
// element arithmetic and the crossing's select in every step the tracked
// reduce took 1.50 times the plain one on SwiftShader against 1.40 (L2;
// Inf 1.40 and 1.29, p = 3 1.53 and 1.48; 10^4 tensors of 10^3
// elements, no-clip, medians of 6 alternating runs); lavapipe the same.
fn step_bounds(st: u32, e: u32) -> vec2<u32> {
    let span = (LANES - 1u) * st;
    let whole = e / 4u;
    return vec2(select(0u, whole - span, whole >= span), whole + select(0u, 1u, (e & 3u) != 0u));
}

// The crossing step of a round whose steps ran from quad q0 to q1 (not
// included), against bounds b (step_bounds): the one step with q in
// [b.x, b.y) (that span is shorter than the LANES * st between steps),
// or NO_STEP.
fn crossing_step(q0: u32, q1: u32, st: u32, b: vec2<u32>) -> u32 {
    let l = LANES * st;
    let q = q0 + select(0u, (b.x - q0 + l - 1u) / l * l, b.x > q0);
    return select(NO_STEP, q, q < q1 && q < b.y);
}

// Adds to the current segment the elements of the main-loop step of quads
// q + k * st that lie before element e (with `before`) or at and after it
// (without).
fn seg_add_step(tr: ptr<function, SegTrack>, q: u32, st: u32, e: u32, before: bool) {
    let lane = vec4(0u, 1u, 2u, 3u);
    for (var k = 0u; k < LANES; k++) {
        let at = q + k * st;
        seg_add(tr, load_quad(at), (vec4(4u * at) + lane < vec4(e)) == vec4(before));
    }
}

// Ends a round of the tracked walk at quad q: a lane past its segment's
// end splits the round's crossing step (main-loop step at quad `cross`,
// or NO_STEP) between it and the next segment, stores it and goes on
// with the next, which holds `next` (the sum or largest bits of the
// round's steps after the end).
fn seg_round_end(tr: ptr<function, SegTrack>, q: u32, st: u32, cross: u32, next_sum: f32, next_top: vec4<u32>) {
    let e = (*tr).hi;
    if (*tr).s <= (*tr).last && e <= 4u * q {
        if cross != NO_STEP {
            seg_add_step(tr, cross, st, e, true);
        }
        seg_flush(tr);
        (*tr).sum = next_sum;
        (*tr).top = next_top;
        if cross != NO_STEP {
            seg_add_step(tr, cross, st, e, false);
        }
    }
}

// plain_quads of a share of a flat chunk, tracking the segments in rounds
// of `round` steps.
fn plain_tracked(r: Run, sh: Share, tr: ptr<function, SegTrack>, round: u32) -> vec4<f32> {
    var s = edge_terms(r, sh);
    let st = sh.stride;
    var q = sh.first;
    // The main loop's steps start before main_end.
    let main_end = max(sh.end, (LANES - 1u) * st) - (LANES - 1u) * st;
    loop {
        let hi = (*tr).hi;
        var cur = (*tr).sum;
        var next = 0.0;
        let bounds = step_bounds(st, hi);
        let q0 = q;
        let stop = min(q + round * LANES * st, main_end);
        for (; q < stop; q += LANES * st) {
            let z0 = plain_value(load_quad(q));
            let z1 = plain_value(load_quad(q + st));
            let z2 = plain_value(load_quad(q + 2u * st));
            let z3 = plain_value(load_quad(q + 3u * st));
            let w = step_terms(z0, z1, z2, z3);
            s += w;
            let g = plain_sum(w);
            let before = q < bounds.x;
            let after = q >= bounds.y;
            cur += select(0.0, g, before);
            next += select(0.0, g, after);
        }
        (*tr).sum = cur;
        seg_round_end(tr, q, st, crossing_step(q0, q, st, bounds), next, vec4(0u));
        if q >= main_end {
            break;
        }
    }
    for (; q < sh.end; q += st) {
        let b = load_quad(q);
        let z = plain_value(b);
        s = fma(term_base(z), z, s);
        seg_take(tr, b, q);
    }
    seg_finish(tr);
    return s;
}

// max_quads of a share of a flat chunk, tracking the segments as
// plain_tracked does.
fn inf_tracked(r: Run, sh: Share, tr: ptr<function, SegTrack>, round: u32) -> Partial {
    var m = max4(max(edge_bits(r, sh, 0u) & vec4(ABS_MASK), edge_bits(r, sh, 1u) & vec4(ABS_MASK)));
    let st = sh.stride;
    var q = sh.first;
    // The main loop's steps start before main_end.
    let main_end = max(sh.end, (LANES - 1u) * st) - (LANES - 1u) * st;
    loop {
        let hi = (*tr).hi;
        var cur = max4((*tr).top);
        var next = 0u;
        let bounds = step_bounds(st, hi);
        let q0 = q;
        let stop = min(q + round * LANES * st, main_end);
        // A step's largest bits as one word before they go to the share
        // and the segments (a max takes them in any order): three vec4
        // maxima and three scalar ones, where a vec4 each for the share,
        // the segment and the next cost four times as many lane operations.
        for (; q < stop; q += LANES * st) {
            let step = block_top(abs_block(q, st));
            m = max(m, step);
            let before = q < bounds.x;
            let after = q >= bounds.y;
            cur = max(cur, select(0u, step, before));
            next = max(next, select(0u, step, after));
        }
        (*tr).top = vec4(cur);
        seg_round_end(tr, q, st, crossing_step(q0, q, st, bounds), 0.0, vec4(next));
        if q >= main_end {
            break;
        }
    }
    for (; q < sh.end; q += st) {
        let b = load_quad(q);
        m = max(m, max4(b & vec4(ABS_MASK)));
        seg_take(tr, b, q);
    }
    seg_finish(tr);
    return inf_accept(r, sh, m);
}

// p_general of a share of a flat chunk, tracking the segments as
// plain_tracked does: each step's terms go to the lane's segment too, and
// the largest bits of the step with them; where the reference moves, the
// segment's sums are rescaled with the accumulators. The accumulators
// take the same terms in the same order as in p_general, so the global
// result keeps its bits. A non-finite element ends the walk as it ends
// p_general's, and the lane's reference becomes EXP_MASK: p_slot marks
// every slot the lane stores after it.
fn p_tracked(r: Run, sh: Share, tr: ptr<function, SegTrack>, round: u32) -> Partial {
    var w = p_walk(r, sh);
    let st = sh.stride;
    var q = sh.first;
    // The main loop's steps start before main_end.
    let main_end = max(sh.end, (LANES - 1u) * st) - (LANES - 1u) * st;
    loop {
        let hi = (*tr).hi;
        var cur = (*tr).sum;
        var cur_top = max4((*tr).top);
        var next = 0.0;
        var next_top = 0u;
        let bounds = step_bounds(st, hi);
        let q0 = q;
        let stop = min(q + round * LANES * st, main_end);
        // The round's steps; a step that passes the limit moves the
        // reference and the sums (the segment's with the accumulators) as
        // in p_general, and goes back in at the same step.
        loop {
            var passed = 0u;
            for (; q < stop; q += LANES * st) {
                let b = abs_block(q, st);
                let bt = block_top(b);
                if bt > w.lim {
                    passed = bt;
                    break;
                }
                let g = plain_sum(p_walk_add(&w, b, bt));
                let before = q < bounds.x;
                let after = q >= bounds.y;
                cur += select(0.0, g, before);
                cur_top = max(cur_top, select(0u, bt, before));
                next += select(0.0, g, after);
                next_top = max(next_top, select(0u, bt, after));
            }
            if passed == 0u {
                break;
            }
            let k = p_walk_rise(&w, passed);
            if w.top >= EXP_MASK {
                break;
            }
            cur *= k;
            next *= k;
        }
        if w.top >= EXP_MASK {
            // exact_quads takes the whole share; the lane's slots from
            // here on are marked.
            (*tr).rf.bits = EXP_MASK;
            q = sh.end;
            break;
        }
        (*tr).sum = cur;
        (*tr).top = vec4(cur_top);
        (*tr).rf = w.rf;
        seg_round_end(tr, q, st, crossing_step(q0, q, st, bounds), next, vec4(next_top));
        if q >= main_end {
            break;
        }
    }
    for (; q < sh.end; q += st) {
        let b = load_quad(q) & vec4(ABS_MASK);
        (*tr).sum *= p_walk_quad(&w, b);
        (*tr).rf = w.rf;
        seg_take(tr, b, q);
    }
    seg_finish(tr);
    return p_walk_finish(r, sh, w, sh.end);
}

// Segment s (sg) of flat chunk run r: its partial from the slots and its
// elements in r's edge quads, when it is one the fast paths would keep.
struct Tracked {
    p: Partial,
    ok: bool,
}

// A general p's slots and edge elements are merged as p-sums (merge_p),
// each relative to its own largest element; a marked slot (p_slot) or a
// non-finite edge element leaves the segment to the per-segment paths.
fn tracked_partial(r: Run, segs: vec2<u32>, sg: Chunk, s: u32) -> Tracked {
    var sum = 0.0;
    var top = 0u;
    var acc = vec3(0.0);
    let qlo = max(sg.start / 4u, r.inner.x);
    let qhi = min((sg.start + sg.len + 3u) / 4u, r.inner.y);
    if sg.len != 0u && qlo < qhi {
        let per = piece_quads(r.inner.y - r.inner.x);
        let j_end = (qhi - 1u - r.inner.x) / per;
        for (var j = (qlo - r.inner.x) / per; j <= j_end; j++) {
            for (var l = 0u; l < TEAM; l++) {
                let i = slot(segs, s, j, l);
                let v = seg_slots[i];
                if general_p() {
                    let w = vec2(v, seg_slots[i + 1u]);
                    acc = merge_p(acc, p_slot_sum(w), cfg.p);
                    top = max(top, w.y);
                } else {
                    sum += bitcast<f32>(v);
                    top = max(top, v);
                }
            }
        }
    }
    let sr = run_of(sg.start, sg.len);
    for (var k = 0u; k < 2u; k++) {
        let e = edge(r, k);
        if e.has {
            let a = quad_in(e.q, sr) & vec4(ABS_MASK);
            if general_p() {
                acc = merge_p(acc, p_quad_sum(a), cfg.p);
            } else {
                sum += plain_sum(plain_term(bitcast<vec4<f32>>(a)));
            }
            top = max(top, max4(a));
        }
    }
    // top is the largest slot's bits, which for p are sums.
    var one = 0u;
    if KIND == 2u {
        one = load_element(sg.start) & ABS_MASK;
    }
    var k = plain_partial(sum, top);
    if general_p() {
        k = Tracked(Partial(acc, 0u), top < EXP_MASK);
    }
    return with_one_element(k, sg.len, one);
}

// The p-sum (s, m, E) of the finite elements of |g| bits a, relative to
// their largest (zeros for a quad of zeros).
fn p_quad_sum(a: vec4<u32>) -> vec3<f32> {
    let top = max4(a);
    let d = decode(top);
    let s = plain_sum(p_terms(a, log2(d.m), d.e, cfg.p));
    return select(vec3(max(s, 1.0), d.m, f32(d.e)), vec3(0.0), top == 0u);
}

// A segment's partial from its plain sum of terms (L2, integer p) or its
// largest bits (Inf), where l2_accept, p_int_accept and inf_accept would
// keep it: a sum in the fast path's window, a finite largest element. Not
// for general p.
fn plain_partial(sum: f32, top: u32) -> Tracked {
    if KIND == 1u {
        return Tracked(Partial(vec3(bitcast<f32>(top), 0.0, 0.0), 0u), top < EXP_MASK);
    }
    if KIND == 2u {
        let p = p_int_partial(sum);
        return Tracked(p, POWER != 0u && p.v.x != 0.0);
    }
    return Tracked(Partial(vec3(0.0, sum, 0.0), 0u), KIND == 0u && in_l2_window(sum));
}

// A tiny segment's plain fold, element by element (plain_partial); what
// it does not keep, a general p's always, declined_fold folds. A segment
// of zeros (an unused bias, say) is kept for L2 and an integer p: its
// plain partial, zeros, is exact_quads' too, but the plain sum's window
// has no zero, and declined it cost its block's queues an exact_quads and
// a clip_of (100 000 tensors of 10 elements, every other one zeros, L2
// no-clip: reduce_tensors 4.9-5.0 ms -> 2.6-2.8 on lavapipe, 36 -> 13-14
// on SwiftShader; p = 3 10-11 -> 4.4-4.6 and 62-65 -> 25-26). Only where
// top, the elements' largest bits, is zero: a tracked segment's top is a
// sum's, which an underflow can make zero.
fn tiny_partial(sg: Chunk) -> Tracked {
    var sum = 0.0;
    var top = 0u;
    // A general p keeps no plain sum, so only a lone element is read: the
    // loop cost 100 000 tensors of 100 elements (p = 1.5, no-clip)
    // 30-40 ms of reduce_tensors' 136-145 on lavapipe and GL.
    let n = select(sg.len, min(sg.len, 1u), general_p());
    for (var i = sg.start; i < sg.start + n; i++) {
        let a = load_element(i) & ABS_MASK;
        sum = add_term(sum, a);
        top = max(top, a);
    }
    var k = plain_partial(sum, top);
    k.ok = k.ok || (top == 0u && !general_p());
    return with_one_element(k, sg.len, top);
}

// sum plus the plain term of the element whose |g| bits are a, rounded
// once: the element-wise folds' one step (tiny_partial, element_partial).
fn add_term(sum: f32, a: u32) -> f32 {
    let y = bitcast<f32>(a);
    return fma(term_base(vec4(y)).x, y, sum);
}

// Segments an invocation takes in reduce_segments before it passes over
// its queues (a bit each in a u32). CPU drivers run a branch's body under
// a lane mask whether or not a lane takes it, so the exact fold and the
// list appends, inside the loop over segments, cost every segment their
// full price there; from the queues they cost one masked pass per block
// (200 000 one-element tensors, L2: reduce_tensors 2.3-2.4 ms on lavapipe
// and 17.7 on SwiftShader with exact_quads for every tiny segment in the
// loop, 1.4-1.6 and 6.2 with tiny_partial and the queues).
const SEG_BLOCK: u32 = 8u;

// Segments shorter than tiny_run() are folded element by element: for a
// handful of elements the fast paths' two edge quads and checks cost more
// than the elements themselves. At least CHUNK / MID_MAX, so that a chunk
// has at most MID_MAX medium segments (32 on GPUs, 128 on CPU drivers).
const TINY_RUN: u32 = 32u;

fn tiny_run() -> u32 {
    return max(TINY_RUN, CHUNK / MID_MAX);
}

// Long segments of the chunk being reduced, found by the invocations that
// scan its segments: fewer than CHUNK / serial_max() <= LONG_MAX. Their
// order in the list depends on scheduling; each is folded on its own, so
// the results do not.
const LONG_MAX: u32 = 128u;
var<workgroup> long_count: atomic<u32>;
var<workgroup> long_n: u32;
var<workgroup> long_list: array<u32, LONG_MAX>;
// Segments of tiny_run() to serial_max() elements, listed the same way: at
// most CHUNK / tiny_run() <= MID_MAX per chunk. A loop over every segment with
// their fold inside cost the fold on every segment on SwiftShader, which
// runs a branch's body under a lane mask whether or not a lane takes it
// (200 000 one-element tensors: reduce 22 -> 61 ms); a loop over the list
// has no iteration when there is none.
const MID_MAX: u32 = 1024u;
var<workgroup> mid_count: atomic<u32>;
var<workgroup> mid_n: u32;
var<workgroup> mid_list: array<u32, MID_MAX>;

// Whether the reduce pass gives the tensors that are one tiny segment
// (fewer than tiny_run() elements) of a flat chunk of several segments
// their norms and factors itself, where it folds that segment, instead of
// storing its partial for tensor_stats: plan::Plan::fuse, which leaves
// those tensors out of the split list. The host sets it for a set that
// has such tensors. Off, the pipeline has none of that code: CPU drivers
// run a branch no lane takes under a lane mask, once per workgroup at
// least. Fusing every whole tensor (a first version) made 10 000 tensors
// of 1 000 elements 0.45 ms slower on lavapipe (10^7 elements, L2,
// no-clip) for the ~0.1 ms of tensor_stats it saved; tiny tensors come
// many to a workgroup, and their statistics cost what their fold costs.
override FUSE: bool = false;

// Whether the per-segment fold has its lists of medium and long segments
// (folded one per invocation and by the whole workgroup). The host turns
// them off for a set whose every flat chunk of several segments is
// tracked or holds only segments shorter than tiny_run()
// (plan::Bound::fold_lists, with a mirror of tracks_segments and
// tracked_round). There the lists would only take the tracked segments
// whose sum a fast path would not keep (a non-finite or extreme element);
// without them declined_fold folds those in the invocation that met them:
// slower for a long segment, as exact. The lists' code costs CPU drivers
// a masked pass per workgroup even when they are empty: 10 000 tensors of
// 1 000 elements on lavapipe (10^7 elements, no-clip), tensor_norms /
// plain step 1.24-1.26 with them, 1.14-1.15 without (L2; Inf 1.22-1.24 and
// 1.16-1.17); 200 000 one-element tensors, reduce_tensors 1.67 and 1.56 ms
// (L2; Inf 1.58 and 1.44).
override FOLD_LISTS: bool = true;

// Whether the first and the last of a flat chunk's segments segs are whole
// tensors: a tensor of more than one segment continues into the chunk
// before or after. Every segment between them is a whole tensor.
fn whole_ends(segs: vec2<u32>) -> vec2<bool> {
    let first = tensor_partials(plan[3u * segs.x + 2u]);
    let last = tensor_partials(plan[3u * (segs.y - 1u) + 2u]);
    return vec2(first.y - first.x == 1u, last.y - last.x == 1u);
}

// Whether segment sg (index s) of a flat chunk of several segments segs
// is a fused tensor (FUSE): a whole tensor of fewer than tiny_run()
// elements, exactly as plan::Plan::fused_with picks them.
fn is_fused(s: u32, sg: Chunk, segs: vec2<u32>, ends: vec2<bool>) -> bool {
    return FUSE && sg.len < tiny_run() && (s != segs.x || ends.x) && (s + 1u != segs.y || ends.y);
}

// Segment s's partial q, published: a fused tensor gets its norm and
// factor here when plain_clip takes it (200 000 one-element tensors on
// lavapipe, L2 no-clip: reduce_tensors 1.46 ms and tensor_stats 1.59
// storing every partial, 1.69 ms and none fused); any other segment
// stores q in partials[s], for tensor_stats or, returning true (a fused
// tensor that plain_clip declines), for the caller's clip_of
// (publish_general) after its loop: CPU drivers run a branch's body under
// a lane mask whether or not a lane takes it, so clip_of inside the loop
// over segments would cost every segment its price.
fn publish(s: u32, tensor: u32, q: Partial, fused: bool, sc: StatScale, clipped: ptr<function, bool>) -> bool {
    if fused {
        let pc = plain_clip(q, sc.unscaling);
        if pc.ok {
            *clipped = store_tensor_stat(tensor, pc.c) || *clipped;
            return false;
        }
    }
    store_partial(s, q);
    return fused;
}

// The general path for segment s, a fused tensor whose partial is stored.
fn publish_general(s: u32, sc: StatScale) -> bool {
    return store_general_stat(plan[3u * s + 2u], load_partial(s), sc);
}

// Flat chunk c's unit run (plan::Plan::unit_run), as [begin, end)
// segment indices: segments that are each a fused tensor of one element,
// the elements one after another in the window and their tensors too.
// Empty where the chunk has none. Only in a FUSE pipeline: the host writes
// the runs where some tensor is fused.
fn unit_run(c: u32) -> vec2<u32> {
    let i = win.units_at + 2u * (c - win.chunk_count);
    return vec2(plan[i], plan[i + 1u]);
}

// Segment index of the v-th segment of a flat chunk that is not in its
// unit run `units`: reduce_segments' loop skips the run.
fn past_units(v: u32, units: vec2<u32>) -> u32 {
    return select(v, v + (units.y - units.x), v >= units.x);
}

// The plain partial of a one-element segment whose |g| bits are a, what
// every path gives such a segment (tiny_partial, tracked_partial, a chunk
// of one element), so that a tensor's results do not depend on whether it
// is in a unit run. For p, what exact_quads gives it (add_p): the
// element's own term, 1, relative to itself, or zeros for a zero. Its
// norm is then exactly |g|, which plain_clip takes (s = 1); an integer
// p's plain partial, |g|^p relative to a power of two, would send every
// such tensor to clip_of's log2 and exp2 (p = 3, 200 000 one-element
// tensors: the per-tensor step 8.6-12.7 times the plain one on lavapipe
// and llvmpipe, 32 on SwiftShader) and round the root. Taken here, a
// finite element's partial also skips exact_quads' two edge quads of
// merge_p (two log2 and an exp2 each, on CPU drivers for every element).
// For L2 a zero's plain partial, zeros, is exact_quads' too, and is kept
// here (the plain sum's window has no zero): a zero gradient of a
// one-element tensor, which training gives where a parameter goes unused,
// would cost the unit run's queues an exact_quads and a clip_of.
fn element_partial(a: u32) -> Tracked {
    if KIND == 2u {
        return Tracked(Partial(select(vec3(0.0), p_self(a), a != 0u), 0u), a < EXP_MASK);
    }
    let k = plain_partial(add_term(0.0, a), a);
    return Tracked(k.p, k.ok || a == 0u);
}

// A segment's plain partial k, or for a segment of one element (len 1)
// whose |g| bits are a, element_partial's. Straight-line for the reason
// of p_step: the segment loops call it for every segment.
fn with_one_element(k: Tracked, len: u32, a: u32) -> Tracked {
    if KIND != 2u {
        return k;
    }
    let one = len == 1u;
    let e = element_partial(a);
    return Tracked(Partial(select(k.p.v, e.p.v, one), select(k.p.flags, e.p.flags, one)), select(k.ok, e.ok, one));
}

// What unit_plain leaves to the queues: nothing, the general path
// (clip_of), or exact_quads first.
const UNIT_DONE: u32 = 0u;
const UNIT_GENERAL: u32 = 1u;
const UNIT_EXACT: u32 = 2u;

// A one-element tensor of bits a (its window element's), index `tensor`:
// its norm and factor where plain_partial and plain_clip take it; else
// what it stores is for the queues to overwrite, in the same invocation.
// Stored either way: under a branch, the store made SwiftShader's
// reduce_tensors 10-30% slower (200 000 one-element tensors).
fn unit_plain(a: u32, tensor: u32, sc: StatScale, clipped: ptr<function, bool>) -> u32 {
    let m = a & ABS_MASK;
    var k: Tracked;
    var pc: PlainClip;
    if KIND == 2u {
        // plain_clip(element_partial(m).p), where element_partial keeps
        // the partial: it is |g| exactly, as (1, mantissa, exponent), and
        // plain_clip takes it where |g| is zero or normal, its norm then
        // mul_pow2(mantissa, exponent), |g| itself. So the norm comes from
        // the bits, with neither decode's normalising nor mul_pow2's range
        // checks.
        k = Tracked(Partial(vec3(0.0), 0u), m < EXP_MASK);
        pc = plain_norm_clip(bitcast<f32>(m), plain_clip_usable(sc.unscaling));
    } else {
        k = element_partial(m);
        pc = plain_clip(k.p, sc.unscaling);
    }
    let ok = k.ok && pc.ok;
    *clipped = (store_tensor_stat(tensor, pc.c) && ok) || *clipped;
    return select(select(UNIT_GENERAL, UNIT_DONE, ok), UNIT_EXACT, !k.ok);
}

// unit_plain for the four one-element tensors of quad q, whose bits are
// b, element i being tensor i + to_tensor.
fn unit_quad(b: vec4<u32>, q: u32, to_tensor: u32, sc: StatScale, clipped: ptr<function, bool>) -> vec4<u32> {
    let i = 4u * q + to_tensor;
    return vec4(
        unit_plain(b.x, i, sc, clipped),
        unit_plain(b.y, i + 1u, sc, clipped),
        unit_plain(b.z, i + 2u, sc, clipped),
        unit_plain(b.w, i + 3u, sc, clipped),
    );
}

// Quads an invocation takes in unit_stats before it passes over its
// queues (four bits each in a u32), for SEG_BLOCK's reason.
const UNIT_BLOCK: u32 = 8u;

// A flat chunk's unit run (its segments `units`, unit_run) as its
// elements: element i of the window is tensor i + to_tensor and segment
// i + to_segment (in u32's wrapping arithmetic).
struct Units {
    run: Run,
    to_tensor: u32,
    to_segment: u32,
}

fn units_of(units: vec2<u32>) -> Units {
    let first = chunk_at(units.x);
    return Units(run_of(first.start, units.y - units.x), first.tensor - first.start, units.x - first.start);
}

// The quads of share sh (no edges) that lie in [u.x, u.y): an invocation's
// quads of a unit run, those it took in the flat walk.
fn share_within(sh: Share, u: vec2<u32>) -> Share {
    let lo = max(sh.first, u.x);
    let first = sh.first + (lo - sh.first + sh.stride - 1u) / sh.stride * sh.stride;
    return Share(first, max(first, min(sh.end, u.y)), sh.stride, vec2(false));
}

// The one-element tensors of a unit run whose results a walk over the
// run gives from their bits: |g| bits m with m - lo < span, or zero, and
// a norm that passes `one` (factor_is_one). Their norm is the one
// unit_plain finds (|g|, for L2 the root of its square, a square in the
// plain sum's window) and their factor 1, so they cost a few compares
// and a store instead of unit_plain's checks and plain_factor's
// division: most of the cost of a one-element tensor's results, and
// one-element tensors (gains, scalar parameters) rarely clip. 200 000 of
// them, no-clip, reduce_tensors: L2 0.51 -> 0.44 ms, p = 3 0.61 -> 0.50
// on lavapipe; L2 3.1 -> 2.0, p = 3 3.5 -> 2.0 on SwiftShader; where half
// of them clip, as before.
struct UnitQuick {
    lo: u32,
    span: u32,
    one: FactorOne,
}

// L2's quick elements have squares in in_l2_window: [2^-39, 2^48) for
// its bounds, exact powers of two, [2^-79, 2^96).
const_assert 0u == (L2_SUM_MIN_BITS & MANT_MASK);
const_assert 0u == (L2_SUM_MAX_BITS & MANT_MASK);

fn unit_quick(sc: StatScale) -> UnitQuick {
    var lo = MIN_NORMAL_BITS;
    var hi = EXP_MASK;
    if KIND == 0u {
        lo = (((L2_SUM_MIN_BITS >> 23u) + 128u) / 2u) << 23u;
        hi = (((L2_SUM_MAX_BITS >> 23u) + 127u) / 2u) << 23u;
    }
    return UnitQuick(lo, hi - lo, factor_one_test(sc.unscaling));
}

// unit_plain's norms of four one-element tensors whose |g| bits m are
// quick (add_term's square for L2).
fn quick_norms(m: vec4<u32>) -> vec4<f32> {
    if KIND == 0u {
        let y = bitcast<vec4<f32>>(m);
        return sqrt(fma(y, y, vec4(0.0)));
    }
    return bitcast<vec4<f32>>(m);
}

// For quad q of bits b: where q is in [quads.x, quads.y) (the unit run's
// inner quads of the invocation's share), stores its four tensors' quick
// results and returns whether all four are quick; elsewhere true. Where
// one is not, the walk goes on with unit_visit from this quad, which
// overwrites them.
fn quick_visit(b: vec4<u32>, q: u32, quads: vec2<u32>, u: Units, k: UnitQuick) -> bool {
    if q < quads.x || q >= quads.y {
        return true;
    }
    let m = b & vec4(ABS_MASK);
    let norm = quick_norms(m);
    let i = 4u * q + u.to_tensor;
    set_tensor_stat(i, TensorStat(norm.x, 1.0, 0, 0u));
    set_tensor_stat(i + 1u, TensorStat(norm.y, 1.0, 0, 0u));
    set_tensor_stat(i + 2u, TensorStat(norm.z, 1.0, 0, 0u));
    set_tensor_stat(i + 3u, TensorStat(norm.w, 1.0, 0, 0u));
    return all(factor_is_one(norm, k.one) & (((m - vec4(k.lo)) < vec4(k.span)) | (m == vec4(0u))));
}

// What the walk over a unit run's quads left: whether some tensor of them
// is left for unit_stats' queues, whether some factor is not 1, and for a
// general p the first quad of the invocation's share whose tensors it did
// not visit (reduce_flat_units_p).
struct UnitWalk {
    pending: bool,
    clipped: bool,
    rest: u32,
}

// unit_quad for quad q of bits b, where q is in [quads.x, quads.y): the
// unit run's inner quads of the invocation's share.
fn unit_visit(w: ptr<function, UnitWalk>, b: vec4<u32>, q: u32, quads: vec2<u32>, u: Units, sc: StatScale) {
    if q >= quads.x && q < quads.y {
        var clipped = (*w).clipped;
        let left = unit_quad(b, q, u.to_tensor, sc, &clipped);
        *w = UnitWalk((*w).pending || any(left != vec4(UNIT_DONE)), clipped, (*w).rest);
    }
}

// The norms and factors of the tensors of unit run `units` (FUSE) of
// flat chunk run r: each invocation takes the run's inner quads of its
// share of r (team_share), each quad's four tensors in straight-line
// code. The flat walk has already taken them with its own loads
// (reduce_flat_units; `walk` is what it left), for a general p up to
// walk.rest (reduce_flat_units_p), and a walk here takes the rest. Where
// some tensor of an invocation's quads is left over (plain_clip declines
// it, or its plain partial is not kept), the invocation walks its quads
// again with queues: those
// plain_clip declines queued, and
// those whose plain partial is not kept queued for exact_quads too (its
// partial stored in the segment's slot, as the per-segment fold does:
// with exact_quads in the general queue's loop, every tensor that
// clip_of takes, each one for an integer p, paid for a masked
// exact_quads: p = 3, 200 000 one-element tensors, 5.6 ms against 3.5
// before this path). The run is whole quads (the host trims it): a
// path for the elements of a quad shared with the segments beside the run
// was one more copy of exact_quads and clip_of in every pipeline that has
// runs, compiled for at most six elements per chunk, which reduce_segments'
// loop gives the same bits. Returns whether some factor is not 1. With
// one invocation per segment, its record, its
// element and its 16-byte statistic gathered and scattered lane by lane,
// 200 000 one-element tensors cost reduce_tensors 1.5-1.7 ms on lavapipe
// (L2, no-clip; the plain reduce 0.13 ms); a throwaway build that gave
// every segment of such chunks its results a quad at a time took 0.42-0.74.
fn unit_stats(units: vec2<u32>, r: Run, t: u32, sc: StatScale, walk: UnitWalk) -> bool {
    let u = units_of(units);
    let ur = u.run;
    var w = walk;
    var clipped = false;
    let sh = share_within(team_share(r, t), ur.inner);
    if general_p() {
        // Quick tensors while they last, then unit_visit (CPU drivers run
        // a branch between them at the price of both).
        let quick = unit_quick(sc);
        var q = max(sh.first, walk.rest);
        for (; q < sh.end; q += sh.stride) {
            if !quick_visit(load_quad(q), q, ur.inner, u, quick) {
                break;
            }
        }
        for (; q < sh.end; q += sh.stride) {
            unit_visit(&w, load_quad(q), q, ur.inner, u, sc);
        }
    }
    clipped = clipped || w.clipped;
    if !w.pending {
        return clipped;
    }
    // The quads again, with the queues. CPU drivers run the queues' loop
    // bodies once under an empty lane mask wherever no lane enters them:
    // here once per invocation where no tensor is left, not once per
    // block of quads as when the first walk had the queues (200 000
    // one-element tensors, L2 no-clip: SwiftShader's reduce_tensors
    // 5.8-6.2 ms -> 3.7-3.9, the plain reduce 0.5-0.6).
    let st = sh.stride;
    for (var q0 = sh.first; q0 < sh.end; q0 += UNIT_BLOCK * st) {
        var exact = 0u;
        var general = 0u;
        for (var j = 0u; j < UNIT_BLOCK && q0 + j * st < sh.end; j++) {
            let q = q0 + j * st;
            let left = unit_quad(load_quad(q), q, u.to_tensor, sc, &clipped);
            let bits = vec4(1u, 2u, 4u, 8u) << vec4(4u * j);
            exact |= dot(vec4<u32>(left == vec4(UNIT_EXACT)), bits);
            general |= dot(vec4<u32>(left != vec4(UNIT_DONE)), bits);
        }
        let from_exact = exact;
        while exact != 0u {
            let j = firstTrailingBit(exact);
            exact &= exact - 1u;
            let i = 4u * (q0 + (j / 4u) * st) + j % 4u;
            let sr = run_of(i, 1u);
            store_partial(i + u.to_segment, exact_quads(sr, whole_share(sr), KIND));
        }
        while general != 0u {
            let j = firstTrailingBit(general);
            general &= general - 1u;
            let i = 4u * (q0 + (j / 4u) * st) + j % 4u;
            let plain = element_partial(load_element(i) & ABS_MASK).p;
            let stored = load_partial(i + u.to_segment);
            let e = (from_exact & (1u << j)) != 0u;
            let q = Partial(select(plain.v, stored.v, e), select(plain.flags, stored.flags, e));
            clipped = store_general_stat(i + u.to_tensor, q, sc) || clipped;
        }
    }
    return clipped;
}

// A segment the fast paths declined (a tracked one's slots, a tiny one's
// plain sum), folded by one invocation: L2 and Inf by exact_quads, a p by
// p_general, which keeps its terms in range without exact_quads's merge
// per element and hands a non-finite segment on to it (10 000 tensors
// over 8 decades of scale, p = 4.5, no-clip: reduce_tensors 220-225 ms
// -> 133-145 on SwiftShader, 79-83 -> 66-67 on GL, 73-74 -> 66-70 on
// lavapipe).
fn declined_fold(r: Run, kind: u32) -> Partial {
    if kind == 2u {
        return p_general(r, whole_share(r));
    }
    return exact_quads(r, whole_share(r), kind);
}

// The partials of flat chunk c's segments (c's own when it is one segment),
// or for a fused tensor (FUSE) its results: those of the chunk's unit run
// by unit_stats, the others by publish(). A segment's
// partial depends only on the segment: one invocation folds a short one,
// the workgroup a long one. The workgroup loops over the long ones only: a
// loop over every segment with a barrier in it costs a barrier's worth per
// segment on CPU drivers (thousands of tiny tensors).
fn reduce_segments(c: u32, t: u32, kind: u32, whole: Partial, tracked: bool, units: vec2<u32>, walk: UnitWalk) {
    let segs = flat_segments(c);
    if UNTRACKED && segs.y - segs.x == 1u {
        if t == 0u {
            store_partial(segs.x, whole);
        }
        return;
    }
    var ends = vec2(false);
    var sc = StatScale(false, false, 1.0);
    if FUSE {
        ends = whole_ends(segs);
        sc = stat_scale();
    }
    var clipped = false;
    // The loop below takes the segments outside the unit run.
    let ch = chunk_at(c);
    let r = run_of(ch.start, ch.len);
    if FUSE && units.y > units.x {
        clipped = unit_stats(units, r, t, sc, walk);
    }
    let end = segs.y - (units.y - units.x);
    if FOLD_LISTS {
        if t == 0u {
            atomicStore(&long_count, 0u);
            atomicStore(&mid_count, 0u);
        }
        workgroupBarrier();
    }
    for (var base = segs.x + t; base < end; base += SEG_BLOCK * WG) {
        // Segments past_units(base + j * WG), j < SEG_BLOCK: tracked and tiny ones
        // folded plainly now, the others queued as bits for declined_fold
        // or the lists, and fused tensors that plain_clip declines for
        // clip_of.
        var exact = 0u;
        var listed = 0u;
        var general = 0u;
        for (var j = 0u; j < SEG_BLOCK && base + j * WG < end; j++) {
            let s = past_units(base + j * WG, units);
            let sg = chunk_at(s);
            var k = Tracked(Partial(vec3(0.0), 0u), false);
            if tracked {
                k = tracked_partial(r, segs, sg, s);
            }
            if !k.ok {
                if sg.len < tiny_run() {
                    k = tiny_partial(sg);
                    exact |= u32(!k.ok) << j;
                } else if FOLD_LISTS {
                    listed |= 1u << j;
                } else {
                    exact |= 1u << j;
                }
            }
            // One call for both paths: CPU drivers would run two copies.
            if k.ok {
                let fused = is_fused(s, sg, segs, ends);
                general |= u32(publish(s, sg.tensor, k.p, fused, sc, &clipped)) << j;
            }
        }
        while exact != 0u {
            let j = firstTrailingBit(exact);
            exact &= exact - 1u;
            let s = past_units(base + j * WG, units);
            let sg = chunk_at(s);
            store_partial(s, declined_fold(run_of(sg.start, sg.len), kind));
            general |= u32(is_fused(s, sg, segs, ends)) << j;
        }
        if FUSE {
            while general != 0u {
                let s = past_units(base + firstTrailingBit(general) * WG, units);
                general &= general - 1u;
                clipped = publish_general(s, sc) || clipped;
            }
        }
        if FOLD_LISTS {
            while listed != 0u {
                let s = past_units(base + firstTrailingBit(listed) * WG, units);
                listed &= listed - 1u;
                if chunk_at(s).len <= serial_max() {
                    mid_list[min(atomicAdd(&mid_count, 1u), MID_MAX - 1u)] = s;
                } else {
                    long_list[min(atomicAdd(&long_count, 1u), LONG_MAX - 1u)] = s;
                }
            }
        }
    }
    if FOLD_LISTS {
        workgroupBarrier();
        if t == 0u {
            long_n = min(atomicLoad(&long_count), LONG_MAX);
            mid_n = min(atomicLoad(&mid_count), MID_MAX);
        }
        // Medium segments: one invocation each, through the fast paths.
        let m = workgroupUniformLoad(&mid_n);
        for (var i = t; i < m; i += WG) {
            let s = mid_list[i];
            let sg = chunk_at(s);
            let r = run_of(sg.start, sg.len);
            store_partial(s, share_fold(r, whole_share(r), kind));
        }
        let n = workgroupUniformLoad(&long_n);
        for (var i = 0u; i < n; i++) {
            let s = workgroupUniformLoad(&long_list[i]);
            let sg = chunk_at(s);
            workgroup_fold(sg.start, sg.len, t, kind);
            if t == 0u {
                store_partial(s, Partial(wg_v[0], wg_f[0]));
            }
            workgroupBarrier();
        }
    }
    if FUSE {
        mark_clipped(clipped);
    }
}

// Folds flat chunk c into partials[c] in the workgroup; returns that
// partial (the same in every invocation). Called in uniform control flow.
fn reduce_flat(c: u32, t: u32) -> Partial {
    let ch = chunk_at(c);
    workgroup_fold(ch.start, ch.len, t, KIND);
    return publish_flat(c, t);
}

// reduce_flat, also filling seg_slots for the chunk's segments segs in
// rounds of `round` steps (where tracks_segments(segs) and tracked_round
// gives one).
fn reduce_flat_tracked(c: u32, t: u32, segs: vec2<u32>, round: u32) -> Partial {
    let ch = chunk_at(c);
    let r = run_of(ch.start, ch.len);
    var tr = seg_track(r, segs, t);
    let sh = team_share(r, t);
    var q: Partial;
    if KIND == 1u {
        q = inf_tracked(r, sh, &tr, round);
    } else if general_p() {
        q = p_tracked(r, sh, &tr, round);
    } else {
        q = plain_accept(r, sh, plain_tracked(r, sh, &tr, round));
    }
    fold_shares(t, q, KIND);
    return publish_flat(c, t);
}

// The merged walk's accumulation of a quad's bits b: plain_quads' tail
// (a plain term added to the sum) for L2 and an integer p, max_quads'
// (the largest |g| bits) for Inf, each kept as bits.
fn units_add(s: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    if KIND == 1u {
        return max(s, b & vec4(ABS_MASK));
    }
    let z = plain_value(b);
    return bitcast<vec4<u32>>(fma(term_base(z), z, bitcast<vec4<f32>>(s)));
}

// Quad q's bits where q < end, else zeros (loading quad q0 < end instead).
fn quad_before(q0: u32, q: u32, end: u32) -> vec4<u32> {
    let inside = q < end;
    return select(vec4(0u), load_quad(select(q0, q, inside)), inside);
}

// A block of reduce_flat_units' walk: quads q + k st, k < LANES, each
// where it is before `end`, else zeros (quad_before).
fn units_block(q: u32, st: u32, end: u32) -> QuadBlock {
    return QuadBlock(load_quad(q), quad_before(q, q + st, end), quad_before(q, q + 2u * st, end), quad_before(q, q + 3u * st, end));
}

fn block_quad(b: QuadBlock, k: u32) -> vec4<u32> {
    return select(select(b.b0, b.b1, k == 1u), select(b.b2, b.b3, k == 3u), k >= 2u);
}

// Adds block b to the walk's sum: as a main-loop step (step_terms) where
// the block is whole, its four quads in turn where it is short, as
// plain_quads' and max_quads' tail loops do (the zeros past the end
// change no bit: a zero term added to a sum of non-negative ones, a zero
// to a max).
fn units_block_add(s: ptr<function, vec4<u32>>, b: QuadBlock, whole: bool) {
    if whole && KIND != 1u {
        let w = step_terms(plain_value(b.b0), plain_value(b.b1), plain_value(b.b2), plain_value(b.b3));
        *s = bitcast<vec4<u32>>(bitcast<vec4<f32>>(*s) + w);
    } else {
        *s = units_add(units_add(units_add(units_add(*s, b.b0), b.b1), b.b2), b.b3);
    }
}

// reduce_flat for a chunk with unit run `units` (FUSE; L2, Inf or an
// integer p; reduce_flat_units_p for a general p): the flat walk of
// plain_quads or max_quads, the same quads in the same accumulators, so
// the global result keeps its bits, also
// giving the run's tensors their results from the same loads (unit_visit;
// unit_stats does the rest with what *walk says). A second walk over the
// run's quads cost lavapipe as much as the flat walk itself (their loads,
// not the statistics' arithmetic, are the cost).
fn reduce_flat_units(c: u32, t: u32, units: vec2<u32>, walk: ptr<function, UnitWalk>) -> Partial {
    let ch = chunk_at(c);
    let r = run_of(ch.start, ch.len);
    let sh = team_share(r, t);
    let u = units_of(units);
    // The run's inner quads in the share's range (a short last block has
    // quads past it, another invocation's).
    let quads = vec2(u.run.inner.x, min(u.run.inner.y, sh.end));
    let sc = stat_scale();
    var s = max(edge_bits(r, sh, 0u) & vec4(ABS_MASK), edge_bits(r, sh, 1u) & vec4(ABS_MASK));
    if KIND != 1u {
        s = bitcast<vec4<u32>>(edge_terms(r, sh));
    }
    let st = sh.stride;
    // Blocks of LANES quads, the last one short where the share ends
    // inside it: plain_quads' tail loop adds those quads to s0 in turn,
    // and so does this, with zeros for the quads past the end (adding a
    // zero term to a sum of non-negative ones, or a zero to a max, changes
    // no bit). One block body, and in it one unit_visit, in a loop over
    // the block's quads: every copy is inlined with its four statistics,
    // and SwiftShader's Subzero JIT, which unrolls no loop, ran four
    // copies a third slower than one (200 000 one-element tensors,
    // no-clip: reduce_tensors L2 4.2-4.5 ms -> 2.9-3.2, p = 3 5.2-6.5 ->
    // 4.4; its pipelines compiled a sixth faster). lavapipe's and
    // llvmpipe's LLVM unrolls it back (the same times as four copies).
    // A loop over a quad's four tensors as well cost SwiftShader a third
    // more than four written out. (QuadBlock holds LANES quads.)
    const_assert LANES == 4u;
    let quick = unit_quick(sc);
    var q = sh.first;
    // First the quick tensors (quick_visit), while every tensor of a
    // block is; from the first block that has another, unit_visit. Two
    // loops, not a branch per block: CPU drivers run a branch's body
    // under a lane mask whether or not a lane takes it. The block that
    // ends the first loop is taken again, whole, by the second. Its four
    // quick_visit calls are written out, with no block_quad selects: the
    // quick visit is a few compares and stores, and as a loop over the
    // block it cost SwiftShader's reduce_tensors 5-15% more (200 000
    // one-element tensors, no-clip, L2 1.72-1.97 -> 1.53-1.57 ms, Inf
    // 1.61-2.01 -> 1.46-1.51, p = 3 2.06-2.10 -> 1.92-2.02).
    for (; q < sh.end; q += LANES * st) {
        let b = units_block(q, st, sh.end);
        if q + (LANES - 1u) * st >= quads.x && q < quads.y {
            let q0 = quick_visit(b.b0, q, quads, u, quick);
            let q1 = quick_visit(b.b1, q + st, quads, u, quick);
            let q2 = quick_visit(b.b2, q + 2u * st, quads, u, quick);
            let q3 = quick_visit(b.b3, q + 3u * st, quads, u, quick);
            if !(q0 && q1 && q2 && q3) {
                break;
            }
        }
        units_block_add(&s, b, q + (LANES - 1u) * st < sh.end);
    }
    for (; q < sh.end; q += LANES * st) {
        let b = units_block(q, st, sh.end);
        units_block_add(&s, b, q + (LANES - 1u) * st < sh.end);
        if q + (LANES - 1u) * st >= quads.x && q < quads.y {
            for (var k = 0u; k < LANES; k++) {
                unit_visit(walk, block_quad(b, k), q + k * st, quads, u, sc);
            }
        }
    }
    var p: Partial;
    if KIND == 1u {
        p = inf_accept(r, sh, max4(s));
    } else {
        p = plain_accept(r, sh, bitcast<vec4<f32>>(s));
    }
    fold_shares(t, p, KIND);
    return publish_flat(c, t);
}

// reduce_flat_units for a general p: p_general's walk, the same steps in
// the same accumulators, so the global result keeps its bits, also giving
// the unit run's tensors their quick results (quick_visit) from the same
// loads while every tensor of a step is quick. From the first step that
// has another, a non-finite element (which ends the walk) or the quads
// past the last step, walk.rest leaves them to unit_stats' walk: a second
// walk over the run's quads cost the per-tensor reduce of 200 000
// one-element tensors (p = 1.5, no-clip) 2.5 times the plain one on
// lavapipe. unit_visit itself stays out of this walk: a general p's is
// rare (a tensor that clips, or is not finite), and one more inlined
// copy of unit_plain for every step.
fn reduce_flat_units_p(c: u32, t: u32, units: vec2<u32>, walk: ptr<function, UnitWalk>) -> Partial {
    let ch = chunk_at(c);
    let r = run_of(ch.start, ch.len);
    let sh = team_share(r, t);
    let u = units_of(units);
    let quick = unit_quick(stat_scale());
    // The run's inner quads while the visits last, then none.
    var visits = u.run.inner;
    var rest = sh.end;
    var w = p_walk(r, sh);
    let st = sh.stride;
    var q = sh.first;
    loop {
        var passed = 0u;
        for (; q + (LANES - 1u) * st < sh.end; q += LANES * st) {
            let b = abs_block(q, st);
            let bt = block_top(b);
            if bt > w.lim {
                passed = bt;
                break;
            }
            if q + (LANES - 1u) * st >= visits.x && q < visits.y {
                let q0 = quick_visit(b.b0, q, visits, u, quick);
                let q1 = quick_visit(b.b1, q + st, visits, u, quick);
                let q2 = quick_visit(b.b2, q + 2u * st, visits, u, quick);
                let q3 = quick_visit(b.b3, q + 3u * st, visits, u, quick);
                if !(q0 && q1 && q2 && q3) {
                    rest = q;
                    visits = vec2(0u);
                }
            }
            p_walk_add(&w, b, bt);
        }
        if passed == 0u {
            break;
        }
        p_walk_rise(&w, passed);
        if w.top >= EXP_MASK {
            break;
        }
    }
    if visits.y != 0u {
        rest = q;
    }
    (*walk).rest = rest;
    let p = p_walk_finish(r, sh, w, q);
    fold_shares(t, p, KIND);
    return publish_flat(c, t);
}

// The flat walk of chunk c with unit run `units` (FUSE, units.y >
// units.x), and the run's tensors' results from the same loads as far as
// it takes them (*walk says where unit_stats goes on): the walk of the
// set's norm, for reduce_tensors and reduce_unit_chunk alike.
fn reduce_flat_unit_run(c: u32, t: u32, units: vec2<u32>, walk: ptr<function, UnitWalk>) -> Partial {
    if general_p() {
        return reduce_flat_units_p(c, t, units, walk);
    }
    return reduce_flat_units(c, t, units, walk);
}

// Stores the workgroup's fold of flat chunk c as its partial and returns it:
// for a p chunk of one element, element_partial's where that is kept, so
// that a tensor of one element alone in a chunk has the partial it has
// anywhere else, and its norm is the global one. (Once per workgroup, in
// uniform control flow: a branch, not with_one_element's selects.)
fn publish_flat(c: u32, t: u32) -> Partial {
    var whole = Partial(wg_v[0], wg_f[0]);
    if KIND == 2u {
        let ch = chunk_at(c);
        let k = element_partial(load_element(ch.start) & ABS_MASK);
        if ch.len == 1u && k.ok {
            whole = k.p;
        }
    }
    if t == 0u {
        store_partial(c, whole);
    }
    workgroupBarrier();
    return whole;
}

// The flat chunk of workgroup wg of a grid of nwg workgroups (row-major,
// as plan::grid lays them out), as an absolute index: past the window's
// flat chunks for the grid's spare workgroups.
fn grid_chunk(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return window_flat().x + wg.x + wg.y * nwg.x;
}

// reduce — reads: grads (this window's flat chunks), the plan's chunks,
// win, cfg.p. Writes: partials[c] for each flat chunk c of window_flat():
// for KIND 0 (L2) (small, medium, big) scaled sums of squares, for 1 (Inf)
// the bits of max |g| over finite g, for 2 (p) (s, m, E) = sum(|g|^p)
// relative to the largest |g| = m * 2^E; each with its FLAG_* bits.
// Dispatch: (x, y, 1) = plan::grid of the busiest window's flat chunks,
// one workgroup per chunk (grid_chunk). For clips that ask for no
// per-tensor results: without reduce_tensors' segment lists in its
// workgroup memory and code, the reduce of 10^7 elements took 19-21 ms
// instead of 27-31 on SwiftShader (lavapipe 4% less, GL within noise).
@compute @workgroup_size(WG)
fn reduce(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let c = grid_chunk(wg, nwg);
    if c < window_flat().y {
        reduce_flat(c, t);
    }
}

// Whether some flat chunk of several segments has a segment outside its
// unit run, which reduce_segments' loop takes (and with it the tracked
// walks and the lists): the host turns it off for a set with fused
// tensors whose every such chunk is all unit run
// (plan::Plan::segments_outside_units), and reduce_tensors is then
// reduce_unit_chunk alone, in the same dispatch. The same walks cost
// more inside the whole of reduce_tensors, whose rest such a chunk never
// reaches (200 000 one-element tensors, no-clip, the per-tensor step over
// the plain one: L2 2.47 -> 2.17 and p = 3 2.40 -> 2.17 on lavapipe, L2
// 4.78 -> 4.08 on SwiftShader, 2.34 -> 2.23 on llvmpipe GL; on SwiftShader
// the plain walk alone took 2.3 times as long there as in an entry point
// of its own). As an entry point of its own, dispatched after
// reduce_tensors for such chunks, it made lavapipe's step slower (2.21 ->
// 2.58): a dispatch costs it more than the walk gains
// (docs/bench-cpu-drivers.md, fifty-first session).
override SEGMENTS: bool = true;

// Whether some flat chunk of the set is walked untracked in
// reduce_tensors: a chunk of one segment, one of several segments that
// tracks_segments or tracked_round declines, or one with a unit run. The
// host turns it off where every flat chunk takes the tracked walk
// (plan::Bound::untracked, with a mirror of both). Off, the pipeline has
// neither the plain nor the unit walk beside the tracked one: CPU drivers
// pay for code no lane runs (SwiftShader runs both sides of a branch
// under a lane mask). 10^7 elements, no-clip, tensor_norms / plain step,
// alternating rounds: 10 000 tensors of 1 000 elements on SwiftShader L2
// 1.52 -> 1.42, Inf 1.49 -> 1.39, p = 3 1.65 -> 1.50, on lavapipe and
// llvmpipe GL L2 1.09 -> 1.07; 100 000 tensors of 100 (fused) L2 3.55 ->
// 3.21 on SwiftShader, 1.89 -> 1.75 on lavapipe, 1.84 -> 1.74 on GL.
override UNTRACKED: bool = true;

// reduce_tensors for flat chunk c of a set without segments outside unit
// runs (SEGMENTS off, FUSE on): a chunk that is all unit run gets what
// reduce_segments gives it (unit_stats after the unit walk, which stores
// the chunk's partial), any other is one segment, whose partial is the
// chunk's.
fn reduce_unit_chunk(c: u32, t: u32) {
    let segs = flat_segments(c);
    var units = vec2(segs.x);
    if FUSE {
        units = unit_run(c);
    }
    if FUSE && units.y > units.x {
        var walk = UnitWalk(false, false, 0u);
        reduce_flat_unit_run(c, t, units, &walk);
        let ch = chunk_at(c);
        mark_clipped(unit_stats(units, run_of(ch.start, ch.len), t, stat_scale(), walk));
    } else {
        let whole = reduce_flat(c, t);
        if t == 0u {
            store_partial(segs.x, whole);
        }
    }
}

// reduce_tensors — what reduce reads and writes, with the same bits, and
// partials[s] for each segment s of those flat chunks (the plan's
// segments): a clip that asks for per-tensor norms or clipping
// (per_tensor_chunks()). Dispatch: as reduce.
@compute @workgroup_size(WG)
fn reduce_tensors(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let c = grid_chunk(wg, nwg);
    if !SEGMENTS {
        // A constant branch: the pipeline has one side.
        if c < window_flat().y {
            reduce_unit_chunk(c, t);
        }
    } else if c < window_flat().y {
        let segs = flat_segments(c);
        var units = vec2(segs.x);
        if FUSE {
            units = unit_run(c);
        }
        let has_units = FUSE && units.y > units.x;
        // A chunk with a unit run is not tracked (its one-element segments
        // are shorter than a block but where the run is all the chunk has:
        // a quad), so that its flat walk can take the run.
        var round = 0u;
        if !UNTRACKED {
            round = tracked_round(c);
        } else if tracks_segments(segs) && !has_units {
            round = tracked_round(c);
        }
        // One call of reduce_segments for every walk: the shader compilers
        // inline it, and a copy per walk took the first per-tensor step
        // twice as long to compile on lavapipe and llvmpipe GL.
        var whole: Partial;
        var walk = UnitWalk(false, false, 0u);
        // The other walks under a constant branch, which a pipeline with
        // UNTRACKED off does not have: with `!UNTRACKED || round != 0u` for
        // a condition SwiftShader kept them (the step of the figures at
        // UNTRACKED 1.49, four rounds, against 1.42).
        var tracked = true;
        if UNTRACKED {
            tracked = round != 0u;
            if !tracked {
                if has_units {
                    whole = reduce_flat_unit_run(c, t, units, &walk);
                } else {
                    whole = reduce_flat(c, t);
                }
            }
        }
        if tracked {
            whole = reduce_flat_tracked(c, t, segs, round);
        }
        reduce_segments(c, t, KIND, whole, tracked, units, walk);
    }
}
