// Reduce pass: each workgroup folds whole flat chunks of the gradients into
// one Partial per chunk, and, when the clip asks for per-tensor results,
// also each of the chunk's segments (one tensor's part of it) into one
// Partial per segment. Workgroups stride over this window's flat chunks, so
// the dispatch never exceeds the per-dimension limit and the result of a
// chunk does not depend on which workgroup took it: the sums are
// deterministic. The flat partials are computed the same way whether or not
// per-tensor results are asked for, so asking cannot move the global norm.
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
// Segments up to this many elements are folded by one invocation alone;
// longer ones by the whole workgroup.
const SERIAL_MAX: u32 = 256u;

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
        let y = select(bitcast<f32>(a + (86u << 23u)), f32(a) * 0x1p-63f, a < 0x00800000u);
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
        let d = decode(a);
        *acc = merge_p(*acc, vec3(1.0, d.m, f32(d.e)), p);
    }
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

// Invocation t's edge quad (lanes 0 and 1; zeros for the others and for
// an edge the run does not have).
fn edge_bits(r: Run, t: u32) -> vec4<u32> {
    if t < 2u {
        let e = edge(r, t);
        if e.has {
            return quad_in(e.q, r);
        }
    }
    return vec4(0u);
}

fn add_quad(kind: u32, acc: ptr<function, vec3<f32>>, flags: ptr<function, u32>, b: vec4<u32>) {
    add_element(kind, acc, flags, b.x);
    add_element(kind, acc, flags, b.y);
    add_element(kind, acc, flags, b.z);
    add_element(kind, acc, flags, b.w);
}

// The exact fold of invocation t's quads of run r, element by element:
// Blue's bins, the max's bits, or the scaled p-sum, with the FLAG_* bits.
// The slow path, for what the fast paths cannot take.
fn exact_quads(r: Run, t: u32, kind: u32) -> Partial {
    var acc = vec3<f32>(0.0);
    var flags = 0u;
    add_quad(kind, &acc, &flags, edge_bits(r, t));
    let w = team_walk(r.inner.y - r.inner.x, t);
    for (var u = w.first; u < w.end; u += TEAM) {
        add_quad(kind, &acc, &flags, load_quad(r.inner.x + u));
    }
    return Partial(acc, flags);
}

// L2 of invocation t's quads of run r. Fast path: plain squares in LANES
// accumulators while the exponent bits show every element in Blue's medium
// band [2^-63, 2^44) or zero, which is exactly what Blue's medium bin adds;
// an invocation that met any other element redoes its quads exactly.
fn l2_quads(r: Run, t: u32) -> Partial {
    let w = team_walk(r.inner.y - r.inner.x, t);
    let ae = edge_bits(r, t) & vec4(ABS_MASK);
    let ye = bitcast<vec4<f32>>(ae);
    var s0 = ye * ye;
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    var hi = ae;          // largest |g| bits seen
    var lo = ae - 1u;     // smallest |g| bits - 1 seen (zero wraps to the top)
    var u = w.first;
    for (; u + (LANES - 1u) * TEAM < w.end; u += LANES * TEAM) {
        let q = r.inner.x + u;
        let a0 = load_quad(q) & vec4(ABS_MASK);
        let a1 = load_quad(q + TEAM) & vec4(ABS_MASK);
        let a2 = load_quad(q + 2u * TEAM) & vec4(ABS_MASK);
        let a3 = load_quad(q + 3u * TEAM) & vec4(ABS_MASK);
        let y0 = bitcast<vec4<f32>>(a0);
        let y1 = bitcast<vec4<f32>>(a1);
        let y2 = bitcast<vec4<f32>>(a2);
        let y3 = bitcast<vec4<f32>>(a3);
        s0 += y0 * y0;
        s1 += y1 * y1;
        s2 += y2 * y2;
        s3 += y3 * y3;
        hi = max(hi, max(max(a0, a1), max(a2, a3)));
        lo = min(lo, min(min(a0 - 1u, a1 - 1u), min(a2 - 1u, a3 - 1u)));
    }
    for (; u < w.end; u += TEAM) {
        let a = load_quad(r.inner.x + u) & vec4(ABS_MASK);
        let y = bitcast<vec4<f32>>(a);
        s0 += y * y;
        hi = max(hi, a);
        lo = min(lo, a - 1u);
    }
    let h = max(max(hi.x, hi.y), max(hi.z, hi.w));
    let l = min(min(lo.x, lo.y), min(lo.z, lo.w));
    if h < TBIG_BITS && l >= TSML_BITS - 1u {
        let v = (s0 + s1) + (s2 + s3);
        return Partial(vec3(0.0, (v.x + v.y) + (v.z + v.w), 0.0), 0u);
    }
    return exact_quads(r, t, 0u);
}

fn max4(a: vec4<u32>) -> u32 {
    return max(max(a.x, a.y), max(a.z, a.w));
}

// The largest |g| bits of invocation t's quads of run r.
fn max_quads(r: Run, t: u32) -> u32 {
    let w = team_walk(r.inner.y - r.inner.x, t);
    var m = edge_bits(r, t) & vec4(ABS_MASK);
    var u = w.first;
    for (; u + (LANES - 1u) * TEAM < w.end; u += LANES * TEAM) {
        let q = r.inner.x + u;
        let a0 = load_quad(q) & vec4(ABS_MASK);
        let a1 = load_quad(q + TEAM) & vec4(ABS_MASK);
        let a2 = load_quad(q + 2u * TEAM) & vec4(ABS_MASK);
        let a3 = load_quad(q + 3u * TEAM) & vec4(ABS_MASK);
        m = max(m, max(max(a0, a1), max(a2, a3)));
    }
    for (; u < w.end; u += TEAM) {
        m = max(m, load_quad(r.inner.x + u) & vec4(ABS_MASK));
    }
    return max4(m);
}

// Inf of invocation t's quads: the max of the bits, exact as it is; the
// element-wise path only to sort out the flags of non-finite elements.
fn inf_quads(r: Run, t: u32) -> Partial {
    let best = max_quads(r, t);
    if best < EXP_MASK {
        return Partial(vec3(bitcast<f32>(best), 0.0, 0.0), 0u);
    }
    return exact_quads(r, t, 1u);
}

// |g|^p relative to the largest element mx = m * 2^e (log2_m = log2(m)):
// one log2 and one exp2, the mantissas' logs differenced before the
// exponents' difference is added, as merge_p does. Zero gives 0.
fn p_term(a: u32, log2_m: f32, e: i32, p: f32) -> f32 {
    if a == 0u {
        return 0.0;
    }
    let d = decode(a);
    return exp2(p * ((log2(d.m) - log2_m) + f32(d.e - e)));
}

fn p_terms(a: vec4<u32>, log2_m: f32, e: i32, p: f32) -> vec4<f32> {
    return vec4(p_term(a.x, log2_m, e, p), p_term(a.y, log2_m, e, p), p_term(a.z, log2_m, e, p), p_term(a.w, log2_m, e, p));
}

// General p of invocation t's quads: the largest element first (one cheap
// pass over quads that the second pass finds in cache), then every term
// relative to it, so each element costs one log2 and one exp2 and the sum
// never over- or underflows: s >= 1 (the largest element's own term).
fn p_quads(r: Run, t: u32) -> Partial {
    let top = max_quads(r, t);
    if top >= EXP_MASK {
        return exact_quads(r, t, 2u);
    }
    if top == 0u {
        return Partial(vec3(0.0), 0u);
    }
    let p = cfg.p;
    let dm = decode(top);
    let lm = log2(dm.m);
    let w = team_walk(r.inner.y - r.inner.x, t);
    var s0 = p_terms(edge_bits(r, t) & vec4(ABS_MASK), lm, dm.e, p);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    var u = w.first;
    for (; u + (LANES - 1u) * TEAM < w.end; u += LANES * TEAM) {
        let q = r.inner.x + u;
        s0 += p_terms(load_quad(q) & vec4(ABS_MASK), lm, dm.e, p);
        s1 += p_terms(load_quad(q + TEAM) & vec4(ABS_MASK), lm, dm.e, p);
        s2 += p_terms(load_quad(q + 2u * TEAM) & vec4(ABS_MASK), lm, dm.e, p);
        s3 += p_terms(load_quad(q + 3u * TEAM) & vec4(ABS_MASK), lm, dm.e, p);
    }
    for (; u < w.end; u += TEAM) {
        s0 += p_terms(load_quad(r.inner.x + u) & vec4(ABS_MASK), lm, dm.e, p);
    }
    let v = (s0 + s1) + (s2 + s3);
    return Partial(vec3((v.x + v.y) + (v.z + v.w), dm.m, f32(dm.e)), 0u);
}

// Invocation t's share of the run [start, start + len) under the kind.
fn thread_quads(start: u32, len: u32, t: u32, kind: u32) -> Partial {
    let r = run_of(start, len);
    switch kind {
        case 0u: {
            return l2_quads(r, t);
        }
        case 1u: {
            return inf_quads(r, t);
        }
        default: {
            return p_quads(r, t);
        }
    }
}

// The whole workgroup's fold of a run, in wg_v[0] / wg_f[0] on return
// (visible to every invocation). Called in uniform control flow.
fn workgroup_fold(start: u32, len: u32, t: u32, kind: u32) {
    let q = thread_quads(start, len, t, kind);
    wg_v[t] = q.v;
    wg_f[t] = q.flags;
    tree_reduce(t, kind);
}

// One invocation's fold of a short run, element by element.
fn serial_fold(start: u32, len: u32, kind: u32) -> Partial {
    let r = run_of(start, len);
    var acc = vec3<f32>(0.0);
    var flags = 0u;
    for (var q = start / 4u; q < (r.end + 3u) / 4u; q++) {
        add_quad(kind, &acc, &flags, quad_in(q, r));
    }
    return Partial(acc, flags);
}

// Long segments of the chunk being reduced, found by the invocations that
// scan its segments: at most CHUNK_ELEMENTS / (SERIAL_MAX + 1) = 127 for
// the host's 32768-element chunks. Their order in the list depends on
// scheduling; each is folded on its own, so the results do not.
const LONG_MAX: u32 = 128u;
var<workgroup> long_count: atomic<u32>;
var<workgroup> long_n: u32;
var<workgroup> long_list: array<u32, LONG_MAX>;

// The partials of flat chunk c's segments (c's own when it is one segment).
// A segment's partial depends only on the segment: one invocation folds a
// short one, the workgroup a long one. The workgroup loops over the long
// ones only: a loop over every segment with a barrier in it costs a
// barrier's worth per segment on CPU drivers (thousands of tiny tensors).
fn reduce_segments(c: u32, t: u32, kind: u32, whole: Partial) {
    let segs = flat_segments(c);
    if segs.y - segs.x == 1u {
        if t == 0u {
            partials[segs.x] = whole;
        }
        return;
    }
    if t == 0u {
        atomicStore(&long_count, 0u);
    }
    workgroupBarrier();
    for (var s = segs.x + t; s < segs.y; s += WG) {
        let sg = chunk_at(s);
        if sg.len <= SERIAL_MAX {
            partials[s] = serial_fold(sg.start, sg.len, kind);
        } else {
            long_list[min(atomicAdd(&long_count, 1u), LONG_MAX - 1u)] = s;
        }
    }
    workgroupBarrier();
    if t == 0u {
        long_n = min(atomicLoad(&long_count), LONG_MAX);
    }
    let n = workgroupUniformLoad(&long_n);
    for (var i = 0u; i < n; i++) {
        let s = workgroupUniformLoad(&long_list[i]);
        let sg = chunk_at(s);
        workgroup_fold(sg.start, sg.len, t, kind);
        if t == 0u {
            partials[s] = Partial(wg_v[0], wg_f[0]);
        }
        workgroupBarrier();
    }
}

// reduce — reads: grads (this window's flat chunks), the plan's chunks and
// segments, win, cfg.p and cfg.flags.
// Writes: partials[c] for each flat chunk c of window_flat(), and, when
// per_tensor_chunks(), partials[s] for each of its segments s: for KIND 0
// (L2) (small, medium, big) scaled sums of squares, for 1 (Inf) the bits of
// max |g| over finite g, for 2 (p) (s, m, E) = sum(|g|^p) relative to the
// largest |g| = m * 2^E; each with its FLAG_* bits.
// Dispatch: (win.flat_workgroups, 1, 1), workgroups striding over window_flat().
@compute @workgroup_size(WG)
fn reduce(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let range = window_flat();
    let segments = per_tensor_chunks();
    for (var c = range.x + wg.x; c < range.y; c += win.flat_workgroups) {
        let ch = chunk_at(c);
        workgroup_fold(ch.start, ch.len, t, KIND);
        let whole = Partial(wg_v[0], wg_f[0]);
        if t == 0u {
            partials[c] = whole;
        }
        workgroupBarrier();
        if segments {
            reduce_segments(c, t, KIND, whole);
        }
    }
}
