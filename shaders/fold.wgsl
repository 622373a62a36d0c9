// Workgroup folding shared by the reduce and finalize passes: per-thread
// values are combined in a fixed tree order, so a result never depends on
// scheduling and repeats bit for bit on the same adapter.

var<workgroup> wg_v: array<vec3<f32>, WG>;
var<workgroup> wg_f: array<u32, WG>;

// Folds the WG per-thread values into wg_v[0] / wg_f[0] in a fixed tree order.
// `kind`: 0 = add (L2), 1 = max of bits (Inf), 2 = scaled p-sum merge.
fn tree_reduce(t: u32, kind: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if t < s {
            wg_v[t] = merge(kind, wg_v[t], wg_v[t + s]);
            wg_f[t] = wg_f[t] | wg_f[t + s];
        }
        workgroupBarrier();
    }
}

// Combines two reductions of the same kind.
fn merge(kind: u32, a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    switch kind {
        case 0u: { return a + b; }
        case 1u: { return vec3(bitcast<f32>(max(bitcast<u32>(a.x), bitcast<u32>(b.x))), 0.0, 0.0); }
        default: { return merge_p(a, b, cfg.p); }
    }
}

// Folds partials[begin .. end) in order.
fn fold_range(kind: u32, begin: u32, end: u32) -> Partial {
    var acc = Partial(vec3<f32>(0.0), 0u);
    for (var c = begin; c < end; c++) {
        let q = partials[c];
        acc = Partial(merge(kind, acc.v, q.v), acc.flags | q.flags);
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

