// AdaGC (Wang et al. 2025, "AdaGC: Improving Training Stability for Large
// Language Model Pretraining"; the authors' Megatron patch): per-tensor
// thresholds from an EMA of each tensor's past clipped norms, computed on the
// GPU between a set's record_norm (with per-tensor norms) and its scale pass.
// The host prepends clip_state.wgsl (ClipState), bits.wgsl, division.wgsl
// and adaptive_records.wgsl (AdaptiveParams, AdaptiveState).
//
// This pass writes the set's stats directly: each tensor's exact factor in
// its TensorStat, ClipState.scale_kind = per tensor and the scale pass's
// indirect dispatch, which the set's scale pass then reads as it reads what
// finalize leaves for a per-tensor clip. A step with a NaN or infinite
// element leaves every γ as it was.
//
// With an unscaling clip (loss scaling) the record_norm's finalize has
// already divided the norms by the loss scale S, decided found_inf and
// updated S; this pass then multiplies each factor by 1/S, so that the scale
// pass unscales and clips in one multiply, and an overflowed step (found_inf)
// leaves the gradients and every γ untouched, as GradScaler skips the step.

// A tensor's norm and its factor, exactly (the set's TensorStat).
struct TensorStat {
    norm: f32,
    coef_mant: f32,
    coef_exp: i32,
    _pad: u32,
}

// The set's stats buffer, up to the per-tensor array: ClipState, then the
// records this pass does not touch (their size is checked by the tests
// against gradclip::records::STATS_TENSORS_OFFSET).
struct Stats {
    state: ClipState,
    _skip: array<u32, 1292>,
    tensors: array<TensorStat>,
}

@group(0) @binding(0) var<storage, read_write> stats: Stats;
@group(0) @binding(1) var<storage, read_write> st: AdaptiveState;
@group(0) @binding(2) var<uniform> prm: AdaptiveParams;

var<workgroup> any_scaled: atomic<u32>;

// The factor of a norm and a threshold (+inf: none), as gradclip's fixed
// clips compute it: PyTorch min(1, τ / (n + 1e-6)), TensorFlow τ / max(n, τ);
// NaN for a NaN norm, 0 (PyTorch) or NaN (TensorFlow) for an infinite one.
fn factor(n: f32, threshold: f32) -> f32 {
    let tf = (prm.flags & P_TENSORFLOW) != 0u;
    if (bitcast<u32>(n) & ABS_MASK) > EXP_MASK {
        return f32_from_bits(QUIET_NAN);
    }
    if !is_finite_f32(n) {
        return select(0.0, f32_from_bits(QUIET_NAN), tf);
    }
    if !is_finite_f32(threshold) {
        return 1.0;
    }
    if tf {
        return select(rounded_divide(threshold, n), 1.0, n <= threshold);
    }
    return min(rounded_divide(threshold, n + 1e-6), 1.0);
}

// adagc_step — reads: stats (the record_norm's state and per-tensor norms),
// st (each tensor's EMA of clipped norms), prm. Writes: each tensor's exact
// factor and the scale dispatch into stats, the updated EMAs into st.
// Dispatch: one workgroup of 64; invocations stride over the tensors.
@compute @workgroup_size(64)
fn adagc_step(@builtin(local_invocation_index) lid: u32) {
    let total = stats.state.total_norm;
    let found_inf = stats.state.found_inf != 0u;
    let all_finite = stats.state.nonfinite == 0u && !found_inf;
    // S when unscaling, else 1: the factors divide it out exactly.
    let unscale = frexp(stats.state.unscaled_by);
    let warm = st.steps < prm.warmup;
    let beta = prm.alpha;
    var global = 1.0;
    if warm {
        global = factor(total, prm.cap);
    }
    var scaled = false;
    for (var i = lid; i < prm.tensors; i += 64u) {
        let n = stats.tensors[i].norm;
        let gamma = bitcast<f32>(st.history[4u * i]);
        var threshold = prm.cap;
        var f = global;
        var next = gamma;
        if warm {
            // γ starts at the smallest norm after the warm-up's global clip.
            let seen = f * n;
            next = select(min(gamma, seen), seen, gamma < 0.0);
        } else {
            // A tensor without γ yet (no warm-up) starts from its own norm.
            var g0 = gamma;
            if gamma < 0.0 {
                g0 = select(f32_from_bits(POS_INF), n, is_finite_f32(n));
            }
            threshold = prm.ratio * g0;
            f = factor(n, threshold);
            let seen = select(n, threshold, n > threshold);
            next = beta * g0 + (1.0 - beta) * seen;
        }
        if all_finite {
            st.history[4u * i] = bitcast<u32>(next);
        }
        st.history[4u * i + 1u] = bitcast<u32>(n);
        st.history[4u * i + 2u] = bitcast<u32>(threshold);
        if found_inf {
            f = 1.0;
        }
        st.history[4u * i + 3u] = bitcast<u32>(f);
        // The exact form the scale pass multiplies by, f / S = m · 2^e with m
        // in [1, 2): one rounding, in the mantissas' quotient (none when S is
        // a power of two, as GradScaler keeps it).
        var m = f;
        var e = 0;
        if found_inf {
            m = 1.0;
        } else if f != 0.0 && is_finite_f32(f) {
            // The fractions are in [0.5, 1); twice them are mantissas.
            let parts = frexp(f);
            let q = mantissa_quotient(2.0 * parts.fract, 2.0 * unscale.fract);
            m = q.m;
            e = parts.exp - unscale.exp - i32(q.below);
        }
        stats.tensors[i].coef_mant = m;
        stats.tensors[i].coef_exp = e;
        if !found_inf && (bitcast<u32>(m) != ONE_BITS || e != 0) {
            scaled = true;
        }
    }
    if scaled {
        atomicOr(&any_scaled, 1u);
    }
    // Every invocation has read st.steps before it changes, and has voted.
    workgroupBarrier();
    if lid == 0u {
        let scale = atomicLoad(&any_scaled) != 0u;
        var decision = select(0u, D_WARMUP, warm);
        if !all_finite {
            decision |= D_SKIPPED;
        } else {
            st.steps += 1u;
        }
        if warm && is_finite_f32(total) && total > prm.cap {
            decision |= D_CLIPPED;
        }
        st.norm = total;
        st.threshold = select(f32_from_bits(POS_INF), prm.cap, warm);
        st.boundary = st.threshold;
        st.decision = decision;
        st.recorded += 1u;
        stats.state.scale_kind = CLIP_SCALE_PER_TENSOR;
        stats.state.dispatch = array<u32, 3>(select(0u, prm.scale_workgroups, scale), 1u, 1u);
    }
}
