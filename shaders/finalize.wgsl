// Finalize pass: one workgroup folds every chunk's Partial in a fixed order
// into the total (per-tensor norms and coefficients, when asked for, come
// from tensor_stats, spread over the device, just before), turns the total
// into the clip factor with the requested semantics, and writes Stats: the
// state (including the scale pass's indirect dispatch, zero workgroups when
// nothing needs to change) and the step's entry of the report log. Reduction kinds: 0 = L2, 1 = Inf, 2 = general p.

// A norm as an f32 (inf if it overflows) and exactly as y * 2^k, y in [1, 2)
// (y = 0 for a zero norm).
struct NormValue {
    norm: f32,
    y: f32,
    k: i32,
}

// A positive finite y * 2^k, normalised so that y is in [1, 2).
fn normalised(y: f32, k: i32) -> NormValue {
    if y == 0.0 {
        return NormValue(0.0, 0.0, 0);
    }
    let d = decode(bitcast<u32>(y));
    // On the bits, so that a subnormal norm survives drivers that flush
    // (SwiftShader's ldexp returned 0 for a norm of 7.5e-39).
    return NormValue(clip_compose(0u, d.m, d.e + k), d.m, d.e + k);
}

// Exponents beyond this are clamped: the value is then far outside f32 (and
// f64) either way, and i32 arithmetic on them stays exact. Tiny p makes
// log2(norm) huge (p = 1e-10 over two equal elements gives 2^(10^10)).
const EXP_CLAMP: f32 = 4096.0;

fn norm_value(q: Partial, kind: u32) -> NormValue {
    switch kind {
        case 0u: {
            let small = q.v.x;
            let medium = q.v.y;
            let big = q.v.z;
            // Bring the bins to the scale of the largest non-empty one (the
            // squares carry twice the element scale); what falls below the
            // normal range there is negligible against the bin it joins.
            if big > 0.0 {
                return normalised(sqrt(big + mul_pow2(medium, -168)), 84);
            }
            if medium >= 0x1p-50f || small == 0.0 {
                return normalised(sqrt(medium + mul_pow2(small, -172)), 0);
            }
            return normalised(sqrt(small + mul_pow2(medium, 172)), -86);
        }
        case 1u: {
            // Exact: the bits of the largest |g|, subnormal or not.
            let a = bitcast<u32>(q.v.x);
            if a == 0u {
                return NormValue(0.0, 0.0, 0);
            }
            let d = decode(a);
            return NormValue(q.v.x, d.m, d.e);
        }
        default: {
            let s = q.v.x;
            if s == 0.0 {
                return NormValue(0.0, 0.0, 0);
            }
            // norm = m * 2^E * s^(1/p); log2 taken on s's mantissa in [0.5, 1),
            // where log2 is accurate to 2^-21 absolute.
            let parts = frexp(s);
            let l = clamp(log2(q.v.y) + (f32(parts.exp) + log2(parts.fract)) / cfg.p, -EXP_CLAMP, EXP_CLAMP);
            let whole = floor(l);
            return normalised(exp2(l - whole), i32(q.v.z) + i32(whole));
        }
    }
}

// A clip factor, exactly: m * 2^e with m in [1, 2), or m = 0, or m NaN.
struct Factor {
    m: f32,
    e: i32,
}

fn factor_one() -> Factor {
    return Factor(1.0, 0);
}

// num / (dm * 2^de) for num >= 0 finite (subnormal included) and dm in [1, 2):
// one rounding of the mantissa quotient, whatever the exponents.
fn divide(num: f32, dm: f32, de: i32) -> Factor {
    let a = bitcast<u32>(num) & ABS_MASK;
    if a == 0u {
        return Factor(0.0, 0);
    }
    let n = decode(a);
    let q = n.m / dm; // in (0.5, 2)
    if q < 1.0 {
        return Factor(q * 2.0, n.e - de - 1);
    }
    return Factor(q, n.e - de);
}

fn factor_f32(f: Factor) -> f32 {
    let b = bitcast<u32>(f.m);
    if (b & ABS_MASK) == 0u || (b & EXP_MASK) == EXP_MASK {
        return f.m;
    }
    return clip_compose(0u, f.m, f.e);
}

fn is_one(f: Factor) -> bool {
    return bitcast<u32>(f.m) == ONE_BITS && f.e == 0;
}

// A norm's clip factor under cfg's semantics, with the element flags that
// make it NaN or zero.
struct Coefficient {
    norm: f32,
    factor: Factor,
    scale_kind: u32,
}

fn coefficient(nv: NormValue, flags: u32) -> Coefficient {
    if flags != 0u {
        // PyTorch: max_norm / (inf + eps) = 0, and NaN spreads. TensorFlow:
        // any non-finite norm makes every gradient NaN.
        let nan = (flags & FLAG_NAN) != 0u;
        let norm = f32_from_bits(select(POS_INF, QUIET_NAN, nan));
        if cfg.semantics == SEMANTICS_TORCH && !nan {
            return Coefficient(norm, Factor(0.0, 0), SCALE_ZERO_FINITE);
        }
        return Coefficient(norm, Factor(f32_from_bits(QUIET_NAN), 0), SCALE_ALL_NAN);
    }
    var f: Factor;
    if cfg.semantics == SEMANTICS_TORCH {
        if is_finite_f32(nv.norm) {
            // PyTorch's f32 arithmetic: max_norm / (norm + 1e-6), min 1.
            let d = decode(bitcast<u32>(nv.norm + 1e-6));
            f = divide(cfg.max_norm, d.m, d.e);
        } else {
            // The norm overflows f32; its exact form still gives the ratio.
            f = divide(cfg.max_norm, nv.y, nv.k);
        }
        if f.m != 0.0 && f.e >= 0 {
            // min(coefficient, 1); a zero max_norm keeps its zero factor.
            f = factor_one();
        }
    } else if is_finite_f32(nv.norm) && nv.norm <= cfg.max_norm {
        f = factor_one();
    } else {
        f = divide(cfg.max_norm, nv.y, nv.k);
    }
    return Coefficient(nv.norm, f, SCALE_MULTIPLY);
}

// Whether S can divide: finite, positive and normal. GradScaler's backoff
// can drive a scale to zero after ~150 overflowing steps in a row; PyTorch
// then unscales by inf and finds every step non-finite, as this does.
fn usable_scale(s: f32) -> bool {
    let b = bitcast<u32>(s);
    return b >= 0x00800000u && b < EXP_MASK;
}

// The norm (of g / S when `unscaling`) and the factor that the stored
// gradients are multiplied by: the clip factor, divided by S when unscaling,
// so that one multiply unscales and clips. `s` is usable when `unscaling`
// and no element is non-finite.
fn clip_of(q: Partial, kind: u32, unscaling: bool, s: f32) -> Coefficient {
    let nv = norm_value(q, kind);
    if !unscaling || q.flags != 0u {
        return coefficient(nv, q.flags);
    }
    let d = decode(bitcast<u32>(s));
    // The norm of g / S = y * 2^k / (m_S * 2^e_S): one division by m_S (none
    // for the powers of two GradScaler keeps) and exponent arithmetic.
    var unscaled = NormValue(0.0, 0.0, 0);
    if nv.y != 0.0 {
        unscaled = normalised(nv.y / d.m, nv.k - d.e);
    }
    let c = coefficient(unscaled, 0u);
    return Coefficient(c.norm, divide(c.factor.m, d.m, d.e - c.factor.e), c.scale_kind);
}

// Whether a supplied total can come out of a reduction of `kind`: the same
// rules as NormPartial::from_bytes and NormPartial::check on the host, so the
// GPU and the CPU agree on which partials they accept.
fn valid_partial(q: Partial, kind: u32) -> bool {
    if (q.flags & ~(FLAG_INF | FLAG_NAN)) != 0u {
        return false;
    }
    let b = bitcast<vec3<u32>>(q.v);
    // Every value finite; sums and maxima non-negative (+0 included, -0
    // not); the third value negative only as a general-p exponent, never -0.
    if any((b & vec3(EXP_MASK)) == vec3(EXP_MASK)) || ((b.x | b.y) & SIGN_MASK) != 0u
        || b.z == SIGN_MASK || (kind != 2u && (b.z & SIGN_MASK) != 0u) {
        return false;
    }
    switch kind {
        case 1u: {
            return b.y == 0u && b.z == 0u;
        }
        case 2u: {
            if b.x == 0u {
                return b.y == 0u && b.z == 0u;
            }
            return b.x >= ONE_BITS && b.y >= ONE_BITS && b.y < 0x40000000u
                && q.v.z == floor(q.v.z) && q.v.z >= -149.0 && q.v.z <= 127.0;
        }
        default: {
            return true;
        }
    }
}

// A tensor's norm and factor where it is plain: clip_of's result, by the
// same arithmetic, for an L2 partial with no element in the big bin and
// the medium one carrying the norm (or the small one empty), or an Inf
// partial whose largest element is normal or zero; no non-finite element,
// no unscaling, a normal max_norm. Code with few and short branches: CPU drivers (Mesa
// 22's lavapipe and llvmpipe, SwiftShader) run every branch's body under a
// lane mask whether or not a lane takes it, uniform conditions included,
// so clip_of costs all of its paths for each tensor there, while a loop
// that no lane enters costs one masked pass of its body. (200 000
// one-element tensors on lavapipe: tensor_stats and finalize 2.8 ms with
// clip_of for every tensor, 2.9 with this path in front of it under an
// if, 1.5 with the queue below.)
struct PlainClip {
    c: Coefficient,
    ok: bool,
}

fn plain_clip(q: Partial, unscaling: bool) -> PlainClip {
    let max_bits = bitcast<u32>(cfg.max_norm);
    var ok = q.flags == 0u && !unscaling && max_bits >= 0x00800000u && max_bits < EXP_MASK;
    var norm: f32;
    if KIND == 0u {
        // norm_value's middle case; its result is 0 or a normal float, so
        // normalised() gives it back unchanged.
        ok = ok && q.v.z == 0.0 && (q.v.y >= 0x1p-50f || q.v.x == 0.0);
        norm = sqrt(q.v.y + mul_pow2(q.v.x, -172));
    } else {
        let a = bitcast<u32>(q.v.x);
        ok = ok && KIND == 1u && (a == 0u || a >= 0x00800000u);
        norm = q.v.x;
    }
    // coefficient's arithmetic for a finite norm and no flags: PyTorch's
    // max_norm / (norm + 1e-6), at most 1; TensorFlow's max_norm / norm
    // above max_norm (nv.y and nv.k are the norm's decode, as here).
    let torch = cfg.semantics == SEMANTICS_TORCH;
    let d = decode(bitcast<u32>(select(norm, norm + 1e-6, torch)));
    var f = divide(cfg.max_norm, d.m, d.e);
    if select(norm <= cfg.max_norm, f.m != 0.0 && f.e >= 0, torch) {
        f = factor_one();
    }
    return PlainClip(Coefficient(norm, f, SCALE_MULTIPLY), ok);
}

// Tensors an invocation takes between two passes over its queue of those
// that plain_clip cannot take (a bit each in a u32).
const STAT_BLOCK: u32 = 8u;

// Tensor i's partial: its segments' partials, folded in order.
fn tensor_partial(i: u32) -> Partial {
    let range = tensor_partials(i);
    return fold_range(KIND, range.x, range.y);
}

fn store_tensor_stat(i: u32, c: Coefficient) -> bool {
    stats.tensors[i] = TensorStat(c.norm, c.factor.m, c.factor.e, 0u);
    return !is_one(c.factor);
}

// tensor_stats — reads: the partials of every tensor's segments (from the
// reduce pass), the plan's per-tensor ranges, cfg, stats.state's loss scale
// (before finalize updates it). Writes: stats.tensors (each tensor's norm
// and factor), and stats.tensors_clipped = cfg.step when some factor is not 1.
// Dispatch: (min(ceil(tensors / (WG * k)), the host's cap), 1, 1) with k =
// STAT_BLOCK on CPU adapters and 1 on others, invocations striding over
// the tensors, up to STAT_BLOCK at a time; recorded between the
// reduce and finalize passes when the clip asks for per-tensor results.
// Every tensor's result depends only on its own partials, folded in order.
@compute @workgroup_size(WG)
fn tensor_stats(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let unscaling = (cfg.flags & CFG_UNSCALE) != 0u;
    let s = stats.state.loss_scale;
    let unscale = unscaling && usable_scale(s);
    let stride = groups.x * WG;
    var clipped = false;
    for (var base = id.x; base < win.tensor_count; base += STAT_BLOCK * stride) {
        // Plain tensors now; the others queued as bits, then taken by
        // clip_of in a loop that costs nothing much when the queue is empty.
        var queue = 0u;
        for (var j = 0u; j < STAT_BLOCK && base + j * stride < win.tensor_count; j++) {
            let i = base + j * stride;
            let pc = plain_clip(tensor_partial(i), unscaling);
            if pc.ok {
                clipped = store_tensor_stat(i, pc.c) || clipped;
            } else {
                queue |= 1u << j;
            }
        }
        while queue != 0u {
            let j = firstTrailingBit(queue);
            queue &= queue - 1u;
            let i = base + j * stride;
            clipped = store_tensor_stat(i, clip_of(tensor_partial(i), KIND, unscale, s)) || clipped;
        }
    }
    if clipped {
        atomicStore(&stats.tensors_clipped, cfg.step);
    }
}

// GradScaler.update (torch's _amp_update_scale_): back off and restart the
// count on a non-finite step; otherwise count it, and grow the scale after
// growth_interval finite steps in a row unless that would make it infinite.
fn update_scale(st: ptr<function, ClipState>, found_inf: bool) {
    let sc = stats.scaler;
    if found_inf {
        (*st).loss_scale = (*st).loss_scale * sc.backoff_factor;
        (*st).growth_tracker = 0u;
        return;
    }
    let successful = (*st).growth_tracker + 1u;
    if successful >= sc.growth_interval {
        let grown = (*st).loss_scale * sc.growth_factor;
        if is_finite_f32(grown) {
            (*st).loss_scale = grown;
        }
        (*st).growth_tracker = 0u;
    } else {
        (*st).growth_tracker = successful;
    }
}

// Writes stats.state and the step's log entry for the total `q`; when
// unscaling, also decides found_inf and applies GradScaler's update to the
// loss scale.
fn finish(q: Partial, kind: u32, per_tensor_clips: bool) {
    var st = stats.state; // keeps loss_scale and growth_tracker
    st.step = cfg.step;
    st.flags = cfg.flags;
    st.max_norm = cfg.max_norm;
    if !valid_partial(q, kind) {
        // Garbage supplied by the caller: touch nothing, change no scale,
        // and say so (the report is Error::InvalidPartial).
        st.total_norm = f32_from_bits(QUIET_NAN);
        st.nonfinite = FLAG_INVALID;
        st.scale_kind = SCALE_MULTIPLY;
        st.coefficient = 1.0;
        st.coef_mant = 1.0;
        st.coef_exp = 0;
        st.found_inf = 0u;
        st.unscaled_by = 1.0;
        st.dispatch = array<u32, 3>(0u, 1u, 1u);
        stats.state = st;
        stats.log[cfg.step % LOG_LEN] = LogEntry(st, q);
        return;
    }
    let unscaling = (cfg.flags & CFG_UNSCALE) != 0u;
    let s = st.loss_scale;
    let found_inf = unscaling && (q.flags != 0u || !usable_scale(s));
    let c = clip_of(q, kind, unscaling && !found_inf, s);
    var factor = c.factor;
    st.total_norm = c.norm;
    st.nonfinite = q.flags;
    st.scale_kind = c.scale_kind;
    st.found_inf = u32(found_inf);
    st.unscaled_by = select(1.0, s, unscaling);
    var scale = c.scale_kind != SCALE_MULTIPLY || !is_one(factor);
    if (cfg.flags & CFG_PER_TENSOR) != 0u {
        // The report's factor stays the global one; the gradients get their tensor's.
        st.scale_kind = SCALE_PER_TENSOR;
        scale = per_tensor_clips;
    }
    let skip = found_inf || (q.flags != 0u && (cfg.flags & CFG_ERROR_IF_NONFINITE) != 0u);
    if skip || (cfg.flags & CFG_NO_SCALE) != 0u {
        scale = false;
    }
    if skip {
        // Untouched gradients: an optimizer multiplying on load sees 1 and
        // found_inf / nonfinite tell it to skip the step.
        factor = factor_one();
        st.scale_kind = SCALE_MULTIPLY;
    }
    st.coef_mant = factor.m;
    st.coef_exp = factor.e;
    st.coefficient = factor_f32(factor);
    if found_inf && q.flags == 0u {
        st.total_norm = f32_from_bits(POS_INF); // finite g over a zero scale
    }
    if unscaling && (cfg.flags & CFG_KEEP_SCALE) == 0u {
        update_scale(&st, found_inf);
    }
    st.dispatch = array<u32, 3>(select(0u, stride_workgroups(), scale), 1u, 1u);
    stats.state = st;
    stats.log[cfg.step % LOG_LEN] = LogEntry(st, q);
}

// finalize — reads: partials of all_chunks() from the reduce pass, cfg,
// stats.state's loss scale and stats.scaler, and when cfg.flags asks for
// per-tensor results stats.tensors_clipped (from tensor_stats).
// Writes: stats.state, stats.partial, stats.log[cfg.step % LOG_LEN], and
// stats.tensors_step when per-tensor results were asked for.
// Dispatch: (1, 1, 1). The reduction kind is the pipeline override KIND.
@compute @workgroup_size(WG)
fn finalize(@builtin(local_invocation_index) t: u32) {
    var acc = vec3<f32>(0.0);
    var flags = 0u;
    let range = all_chunks();
    for (var c = range.x + t; c < range.y; c += WG) {
        let q = partials[c];
        acc = merge(KIND, acc, q.v);
        flags |= q.flags;
    }
    wg_v[t] = acc;
    wg_f[t] = flags;
    tree_reduce(t, KIND);
    if t == 0u {
        var per_tensor_clips = false;
        if per_tensor_chunks() {
            // tensor_stats ran just before, for this step (norm clips
            // number their steps from 1, so the initial 0 matches none).
            stats.tensors_step = cfg.step;
            per_tensor_clips = atomicLoad(&stats.tensors_clipped) == cfg.step;
        }
        let total = Partial(wg_v[0], wg_f[0]);
        stats.partial = total;
        finish(total, KIND, per_tensor_clips);
    }
}

// finish_supplied — reads: cfg.supplied (a total combined across shards,
// recorded by the host or copied from the caller's buffer), cfg, stats.state's
// loss scale and stats.scaler. Writes: stats.state, stats.partial, stats.log[cfg.step % LOG_LEN].
// Dispatch: (1, 1, 1); one invocation works. The reduction kind is the pipeline override KIND.
@compute @workgroup_size(WG)
fn finish_supplied(@builtin(local_invocation_index) t: u32) {
    if t == 0u {
        stats.partial = cfg.supplied;
        finish(cfg.supplied, KIND, false);
    }
}
