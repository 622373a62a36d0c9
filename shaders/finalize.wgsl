// Finalize pass: one workgroup folds every chunk's Partial in a fixed order
// into the total, computes per-tensor norms and coefficients when asked,
// turns the total into the clip coefficient with the requested semantics,
// and writes Stats, including the scale pass's indirect dispatch (zero
// workgroups when nothing needs to change). Reduction kinds: 0 = L2, 1 = Inf,
// 2 = general p.

// A norm as an f32 (inf if it overflows) and exactly as y * 2^k.
struct NormValue {
    norm: f32,
    y: f32,
    k: i32,
}

fn norm_value(q: Partial, kind: u32) -> NormValue {
    switch kind {
        case 0u: {
            let small = q.v.x;
            let medium = q.v.y;
            let big = q.v.z;
            // Bring the bins to the scale of the largest non-empty one (the
            // squares carry twice the element scale); what falls below the
            // normal range there is negligible against the bin it joins.
            var y: f32;
            var k: i32;
            if big > 0.0 {
                y = sqrt(big + mul_pow2(medium, -168));
                k = 84;
            } else if medium >= 0x1p-50f || small == 0.0 {
                y = sqrt(medium + mul_pow2(small, -172));
                k = 0;
            } else {
                y = sqrt(small + mul_pow2(medium, 172));
                k = -86;
            }
            return NormValue(scale_pow2(y, k), y, k);
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
            let l = log2(q.v.y) + (f32(parts.exp) + log2(parts.fract)) / cfg.p;
            let whole = floor(l);
            let y = exp2(l - whole);
            let k = i32(q.v.z) + i32(whole);
            return NormValue(scale_pow2(y, k), y, k);
        }
    }
}

// A norm's coefficient under cfg's semantics, with the element flags that
// make it NaN or infinite.
struct Coefficient {
    norm: f32,
    value: f32,
    scale_kind: u32,
}

fn coefficient(nv: NormValue, flags: u32) -> Coefficient {
    if flags != 0u {
        // PyTorch: max_norm / (inf + eps) = 0, and NaN spreads. TensorFlow:
        // any non-finite norm makes every gradient NaN.
        let nan = (flags & FLAG_NAN) != 0u;
        let norm = bitcast<f32>(select(POS_INF, QUIET_NAN, nan));
        if cfg.semantics == SEMANTICS_TORCH && !nan {
            return Coefficient(norm, 0.0, SCALE_ZERO_FINITE);
        }
        return Coefficient(norm, f32_from_bits(QUIET_NAN), SCALE_ALL_NAN);
    }
    var c: f32;
    if !is_finite_f32(nv.norm) {
        // The norm overflows f32; its exact form still gives the ratio.
        c = scale_pow2(cfg.max_norm / nv.y, -nv.k);
    } else if cfg.semantics == SEMANTICS_TORCH {
        c = min(cfg.max_norm / (nv.norm + 1e-6), 1.0);
    } else if nv.norm <= cfg.max_norm {
        c = 1.0;
    } else {
        c = cfg.max_norm / nv.norm;
    }
    return Coefficient(nv.norm, c, SCALE_MULTIPLY);
}

// Whether S can divide: finite, positive and normal. GradScaler's backoff
// can drive a scale to zero after ~150 overflowing steps in a row; PyTorch
// then unscales by inf and finds every step non-finite, as this does.
fn usable_scale(s: f32) -> bool {
    let b = bitcast<u32>(s);
    return b >= 0x00800000u && b < EXP_MASK;
}

// The norm of g / S from the norm of g = y * 2^k: S = m * 2^e, so one
// division by m (none for the powers of two GradScaler keeps) and exponent
// arithmetic; correct where g's norm overflows f32 and g / S's does not.
fn unscaled(nv: NormValue, s: f32) -> NormValue {
    if nv.y == 0.0 {
        return NormValue(0.0, 0.0, 0);
    }
    let d = decode(bitcast<u32>(s));
    let y = nv.y / d.m;
    let k = nv.k - d.e;
    return NormValue(scale_pow2(y, k), y, k);
}

// The norm (of g / S when `unscaling`) and the factor that the stored
// gradients are multiplied by: the clip coefficient, divided by S when
// unscaling, so that one multiply unscales and clips. `s` is usable when
// `unscaling` and no element is non-finite.
fn clip_of(q: Partial, kind: u32, unscaling: bool, s: f32) -> Coefficient {
    let nv = norm_value(q, kind);
    if !unscaling || q.flags != 0u {
        return coefficient(nv, q.flags);
    }
    let d = decode(bitcast<u32>(s));
    let c = coefficient(unscaled(nv, s), 0u);
    return Coefficient(c.norm, scale_pow2(c.value / d.m, -d.e), c.scale_kind);
}

var<workgroup> any_tensor_clipped: atomic<u32>;

// Every tensor's norm and coefficient into stats.tensors; called by all
// invocations. Returns whether any tensor coefficient differs from 1 (only
// invocation 0 uses the answer, so it needs no uniformity).
fn tensor_norms(t: u32, kind: u32) -> bool {
    if t == 0u {
        atomicStore(&any_tensor_clipped, 0u);
    }
    let unscaling = (cfg.flags & CFG_UNSCALE) != 0u;
    let s = stats.state.loss_scale;
    let unscale = unscaling && usable_scale(s);
    workgroupBarrier();
    for (var i = t; i < win.tensor_count; i += WG) {
        let range = stats.tensors[i];
        let q = fold_range(kind, range.chunk_begin, range.chunk_end);
        let c = clip_of(q, kind, unscale, s);
        stats.tensors[i].norm = c.norm;
        stats.tensors[i].coefficient = c.value;
        if bitcast<u32>(c.value) != ONE_BITS {
            atomicOr(&any_tensor_clipped, 1u);
        }
    }
    workgroupBarrier();
    return atomicLoad(&any_tensor_clipped) != 0u;
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

// Writes stats.state for the total `q`; when unscaling, also decides
// found_inf and applies GradScaler's update to the loss scale.
fn finish(q: Partial, kind: u32, per_tensor_clips: bool) {
    var st = stats.state; // keeps loss_scale and growth_tracker
    let unscaling = (cfg.flags & CFG_UNSCALE) != 0u;
    let s = st.loss_scale;
    let found_inf = unscaling && (q.flags != 0u || !usable_scale(s));
    let c = clip_of(q, kind, unscaling && !found_inf, s);
    st.total_norm = c.norm;
    st.nonfinite = q.flags;
    st.coefficient = c.value;
    st.scale_kind = c.scale_kind;
    st.found_inf = u32(found_inf);
    st.unscaled_by = select(1.0, s, unscaling);
    var scale = c.scale_kind != SCALE_MULTIPLY || bitcast<u32>(c.value) != ONE_BITS;
    if (cfg.flags & CFG_PER_TENSOR) != 0u {
        // The report's coefficient stays the global one; the gradients get their tensor's.
        st.scale_kind = SCALE_PER_TENSOR;
        scale = per_tensor_clips;
    }
    let skip = found_inf || (q.flags != 0u && cfg.error_if_nonfinite != 0u);
    if skip || (cfg.flags & CFG_NO_SCALE) != 0u {
        scale = false;
    }
    if skip {
        // Untouched gradients: an optimizer multiplying on load sees 1 and
        // found_inf / nonfinite tell it to skip the step.
        st.coefficient = 1.0;
    }
    if found_inf && q.flags == 0u {
        st.total_norm = f32_from_bits(POS_INF); // finite g over a zero scale
    }
    if unscaling {
        update_scale(&st, found_inf);
    }
    st.dispatch = array<u32, 3>(select(0u, stride_workgroups(), scale), 1u, 1u);
    stats.state = st;
}

// Shared body of the finalize entry points.
fn finalize(t: u32, kind: u32) {
    var acc = vec3<f32>(0.0);
    var flags = 0u;
    let range = all_chunks();
    for (var c = range.x + t; c < range.y; c += WG) {
        let q = partials[c];
        acc = merge(kind, acc, q.v);
        flags |= q.flags;
    }
    wg_v[t] = acc;
    wg_f[t] = flags;
    tree_reduce(t, kind);
    var per_tensor_clips = false;
    if (cfg.flags & (CFG_TENSOR_NORMS | CFG_PER_TENSOR)) != 0u {
        per_tensor_clips = tensor_norms(t, kind);
    }
    if t == 0u {
        let total = Partial(wg_v[0], wg_f[0]);
        stats.partial = total;
        finish(total, kind, per_tensor_clips);
    }
}

// finalize_l2 — reads: partials of all_chunks() from reduce_l2, cfg, stats.tensors ranges.
// Writes: stats (state, partial, per-tensor norms when cfg.flags asks; with
// CFG_UNSCALE reads and updates the loss scale in stats.state from stats.scaler). Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn finalize_l2(@builtin(local_invocation_index) t: u32) {
    finalize(t, 0u);
}

// finalize_inf — reads: partials of all_chunks() from reduce_inf, cfg, stats.tensors ranges.
// Writes: stats (state, partial, per-tensor norms when cfg.flags asks; with
// CFG_UNSCALE reads and updates the loss scale in stats.state from stats.scaler). Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn finalize_inf(@builtin(local_invocation_index) t: u32) {
    finalize(t, 1u);
}

// finalize_p — reads: partials of all_chunks() from reduce_p, cfg, stats.tensors ranges.
// Writes: stats (state, partial, per-tensor norms when cfg.flags asks; with
// CFG_UNSCALE reads and updates the loss scale in stats.state from stats.scaler). Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn finalize_p(@builtin(local_invocation_index) t: u32) {
    finalize(t, 2u);
}

// finish_l2 — reads: stats.partial (a total combined across shards, copied in by the host), cfg.
// Writes: stats.state (with CFG_UNSCALE: found_inf and the updated loss scale, from stats.scaler).
// Dispatch: (1, 1, 1); one invocation works.
@compute @workgroup_size(WG)
fn finish_l2(@builtin(local_invocation_index) t: u32) {
    if t == 0u {
        finish(stats.partial, 0u, false);
    }
}

// finish_inf — reads: stats.partial (a total combined across shards), cfg.
// Writes: stats.state (with CFG_UNSCALE: found_inf and the updated loss scale, from stats.scaler).
// Dispatch: (1, 1, 1); one invocation works.
@compute @workgroup_size(WG)
fn finish_inf(@builtin(local_invocation_index) t: u32) {
    if t == 0u {
        finish(stats.partial, 1u, false);
    }
}

// finish_p — reads: stats.partial (a total combined across shards), cfg.
// Writes: stats.state (with CFG_UNSCALE: found_inf and the updated loss scale, from stats.scaler).
// Dispatch: (1, 1, 1); one invocation works.
@compute @workgroup_size(WG)
fn finish_p(@builtin(local_invocation_index) t: u32) {
    if t == 0u {
        finish(stats.partial, 2u, false);
    }
}
