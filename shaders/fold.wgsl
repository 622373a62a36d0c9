// Workgroup folding shared by the reduce and finalize passes: per-thread
// values are combined in a fixed tree order, so a result never depends on
// scheduling and repeats bit for bit on the same adapter.

var<workgroup> wg_v: array<vec3<f32>, WG>;
var<workgroup> wg_f: array<u32, WG>;

// Values each folding invocation combines in the first step of tree_reduce.
const FOLD_FAN: u32 = 16u;

// Folds the WG per-thread values into wg_v[0] / wg_f[0] in a fixed order:
// WG / FOLD_FAN invocations each fold FOLD_FAN neighbours, then invocation 0
// folds their results. Three barriers instead of log2(WG) + 1: on CPU
// drivers every barrier switches all invocations of the workgroup.
// The result is visible to every invocation on return. WG >= 32.
fn tree_reduce(t: u32, kind: u32) {
    workgroupBarrier();
    if t < WG / FOLD_FAN {
        let at = t * FOLD_FAN;
        var v = wg_v[at];
        var f = wg_f[at];
        for (var k = 1u; k < FOLD_FAN; k++) {
            v = merge(kind, v, wg_v[at + k]);
            f |= wg_f[at + k];
        }
        wg_v[at] = v;
        wg_f[at] = f;
    }
    workgroupBarrier();
    if t == 0u {
        var v = wg_v[0];
        var f = wg_f[0];
        for (var k = FOLD_FAN; k < WG; k += FOLD_FAN) {
            v = merge(kind, v, wg_v[k]);
            f |= wg_f[k];
        }
        wg_v[0] = v;
        wg_f[0] = f;
    }
    workgroupBarrier();
}

// The workgroup's fold of each invocation's partial q, in wg_v[0] /
// wg_f[0] on return (visible to every invocation). Called in uniform
// control flow.
fn fold_shares(t: u32, q: Partial, kind: u32) {
    wg_v[t] = q.v;
    wg_f[t] = q.flags;
    tree_reduce(t, kind);
}

// Combines two reductions of the same kind.
fn merge(kind: u32, a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    switch kind {
        case 0u: { return a + b; }
        case 1u: { return vec3(bitcast<f32>(max(bitcast<u32>(a.x), bitcast<u32>(b.x))), 0.0, 0.0); }
        default: { return merge_p(a, b, cfg.p); }
    }
}

// Folds partials[begin .. end) with the whole workgroup, invocation t
// taking begin + t, begin + t + WG, ... (fold_strided), then tree_reduce:
// finalize's order, and long_tensor_stats' (fold_short gives it on one
// invocation to a range of up to WG partials). Every invocation must call
// it (it has barriers); the result is invocation 0's, and the others get
// an empty partial: their reads of wg_v[0] would race invocation 0's
// write of the next fold.
fn fold_workgroup(t: u32, kind: u32, begin: u32, end: u32) -> Partial {
    fold_shares(t, fold_strided(kind, begin + t, end, WG), kind);
    if t != 0u {
        return Partial(vec3<f32>(0.0), 0u);
    }
    return Partial(wg_v[0], wg_f[0]);
}

// Folds partials[begin .. end), at most WG of them, in finalize's order,
// on one invocation: with no more partials than invocations, invocation t
// of a workgroup holds partial begin + t alone, and tree_reduce merges
// those shares FOLD_FAN at a time, front to back, then the groups' results
// front to back. A tensor's partials are folded so, and not all front to
// back, because a tensor alone in its layout then gets the global norm's
// bits as its own: one million f32 elements clipped per tensor gave a
// factor one ulp off the global clip's, and other bits in every gradient.
// Merging an empty partial changes no bit, so n <= FOLD_FAN is front to
// back. One loop, no nest of them: CPU drivers run each loop level under a
// lane mask for every tensor (10 000 tensors at 10^7, tensor_stats and
// finalize: SwiftShader 1.8-2.0 ms with a loop over groups around
// fold_strided, 0.8-1.2 with this one; lavapipe 0.41-0.47 and 0.31-0.38).
fn fold_short(kind: u32, begin: u32, end: u32) -> Partial {
    var total = Partial(vec3<f32>(0.0), 0u);
    var group = Partial(vec3<f32>(0.0), 0u);
    for (var c = begin; c < end; c++) {
        group = merge_partial(kind, group, load_partial(c));
        if (c - begin) % FOLD_FAN == FOLD_FAN - 1u {
            total = merge_partial(kind, total, group);
            group = Partial(vec3<f32>(0.0), 0u);
        }
    }
    return merge_partial(kind, total, group);
}

fn merge_partial(kind: u32, a: Partial, b: Partial) -> Partial {
    return Partial(merge(kind, a.v, b.v), a.flags | b.flags);
}

// Folds partials begin, begin + stride, ... below end, in that order, with
// four loads issued before their merges: a GPU otherwise waits out each
// load before it issues the next. On an H200 finalize, 30 partials an
// invocation at 2.5·10^8 elements, took 24 µs so and 16-18 µs with four in
// flight; one tensor's 7 629 on one invocation of tensor_stats (before
// long_tensor_stats) 1.25 ms and 0.74-1.1 ms.
// The merges keep their order, so the result is the same bits.
fn fold_strided(kind: u32, begin: u32, end: u32, stride: u32) -> Partial {
    var acc = Partial(vec3<f32>(0.0), 0u);
    var c = begin;
    // Partial counts are far below 2^32 / 4, so c + 3 * stride cannot wrap.
    for (; c + 3u * stride < end; c += 4u * stride) {
        let q0 = load_partial(c);
        let q1 = load_partial(c + stride);
        let q2 = load_partial(c + 2u * stride);
        let q3 = load_partial(c + 3u * stride);
        acc = merge_partial(kind, acc, q0);
        acc = merge_partial(kind, acc, q1);
        acc = merge_partial(kind, acc, q2);
        acc = merge_partial(kind, acc, q3);
    }
    for (; c < end; c += stride) {
        acc = merge_partial(kind, acc, load_partial(c));
    }
    return acc;
}

// Merges two p-sums (s, m, E): each is sum(|g|^p) / (m * 2^E)^p with m * 2^E
// the largest |g| seen, so s is in [1, n] and nothing over- or underflows
// whatever p is. s == 0 marks an empty sum.
fn merge_p(a: vec3<f32>, b: vec3<f32>, p: f32) -> vec3<f32> {
    if a.x == 0.0 {
        return b;
    }
    if b.x == 0.0 {
        return a;
    }
    let a_hi = a.z > b.z || (a.z == b.z && a.y >= b.y);
    let hi = select(b, a, a_hi);
    let lo = select(a, b, a_hi);
    let r = exp2(p * ((log2(lo.y) - log2(hi.y)) + (lo.z - hi.z)));
    return vec3(hi.x + lo.x * r, hi.y, hi.z);
}

