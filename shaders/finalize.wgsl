// Finalize pass: one workgroup folds every chunk's Partial in a fixed order
// into the total norm, turns it into the clip coefficient with the requested
// semantics, and writes ClipState, including the scale pass's indirect
// dispatch (zero workgroups when nothing needs to change).

// Folds partials[0 .. win.chunk_count) into wg_v[0] / wg_f[0].
fn fold_partials(t: u32, kind: u32) {
    var acc = vec3<f32>(0.0);
    var flags = 0u;
    for (var c = t; c < win.chunk_count; c += WG) {
        let q = partials[c];
        switch kind {
            case 0u: { acc += q.v; }
            case 1u: { acc = vec3(bitcast<f32>(max(bitcast<u32>(acc.x), bitcast<u32>(q.v.x))), 0.0, 0.0); }
            default: { acc = merge_p(acc, q.v, cfg.p); }
        }
        flags |= q.flags;
    }
    wg_v[t] = acc;
    wg_f[t] = flags;
    tree_reduce(t, kind);
}

// The ratio max_norm / norm for a norm y * 2^k that overflows f32.
fn coefficient_of_huge(y: f32, k: i32) -> f32 {
    return scale_pow2(cfg.max_norm / y, -k);
}

// Writes ClipState for a total norm y * 2^k (y a normal float) and the
// non-finite flags of the elements.
fn finish(y: f32, k: i32, flags: u32) {
    var st: ClipState;
    st.nonfinite = flags;
    st.scale_kind = SCALE_MULTIPLY;
    st.coefficient = 1.0;
    st.dispatch = array<u32, 3>(0u, 1u, 1u);
    if flags != 0u {
        let nan = (flags & FLAG_NAN) != 0u;
        st.total_norm = bitcast<f32>(select(POS_INF, QUIET_NAN, nan));
        if cfg.error_if_nonfinite == 0u {
            // PyTorch: coefficient max_norm / (inf + eps) = 0; NaN spreads.
            // TensorFlow: any non-finite norm makes every gradient NaN.
            let zero = cfg.semantics == SEMANTICS_TORCH && !nan;
            st.coefficient = select(f32_from_bits(QUIET_NAN), 0.0, zero);
            st.scale_kind = select(SCALE_ALL_NAN, SCALE_ZERO_FINITE, zero);
            st.dispatch[0] = win.workgroups;
        }
    } else {
        let norm = scale_pow2(y, k);
        st.total_norm = norm;
        var coef: f32;
        if !is_finite_f32(norm) {
            coef = coefficient_of_huge(y, k);
        } else if cfg.semantics == SEMANTICS_TORCH {
            coef = min(cfg.max_norm / (norm + 1e-6), 1.0);
        } else if norm <= cfg.max_norm {
            coef = 1.0;
        } else {
            coef = cfg.max_norm / norm;
        }
        st.coefficient = coef;
        st.dispatch[0] = select(win.workgroups, 0u, bitcast<u32>(coef) == ONE_BITS);
    }
    state = st;
}

// finalize_l2 — reads: partials[0 .. win.chunk_count) from reduce_l2, cfg.
// Writes: state. Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn finalize_l2(@builtin(local_invocation_index) t: u32) {
    fold_partials(t, 0u);
    if t == 0u {
        let small = wg_v[0].x;
        let medium = wg_v[0].y;
        let big = wg_v[0].z;
        // Bring the bins to the scale of the largest non-empty one (the
        // squares carry twice the element scale); what falls below the
        // normal range there is negligible against the bin it joins.
        if big > 0.0 {
            finish(sqrt(big + mul_pow2(medium, -168)), 84, wg_f[0]);
        } else if medium >= 0x1p-50f || small == 0.0 {
            finish(sqrt(medium + mul_pow2(small, -172)), 0, wg_f[0]);
        } else {
            finish(sqrt(small + mul_pow2(medium, 172)), -86, wg_f[0]);
        }
    }
}

// finalize_inf — reads: partials[0 .. win.chunk_count) from reduce_inf, cfg.
// Writes: state. Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn finalize_inf(@builtin(local_invocation_index) t: u32) {
    fold_partials(t, 1u);
    if t == 0u {
        let top = bitcast<u32>(wg_v[0].x);
        if top < 0x00800000u {
            // Zero or subnormal: report the bits as they are; a flushing
            // compiler must not see them in arithmetic.
            finish(0x1p-64f, -200, wg_f[0]);
            if wg_f[0] == 0u {
                state.total_norm = bitcast<f32>(top);
            }
        } else {
            finish(bitcast<f32>(top), 0, wg_f[0]);
        }
    }
}

// finalize_p — reads: partials[0 .. win.chunk_count) from reduce_p, cfg.
// Writes: state. Dispatch: (1, 1, 1).
@compute @workgroup_size(WG)
fn finalize_p(@builtin(local_invocation_index) t: u32) {
    fold_partials(t, 2u);
    if t == 0u {
        let s = wg_v[0].x;
        if s == 0.0 {
            finish(1.0, 0, wg_f[0]);
            state.total_norm = 0.0;
            if wg_f[0] == 0u {
                state.coefficient = 1.0;
                state.dispatch[0] = 0u;
            }
            return;
        }
        // norm = m * 2^E * s^(1/p); log2 taken on s's mantissa in [0.5, 1),
        // where log2 is accurate to 2^-21 absolute.
        let parts = frexp(s);
        let l = log2(wg_v[0].y) + (f32(parts.exp) + log2(parts.fract)) / cfg.p;
        let whole = floor(l);
        finish(exp2(l - whole), i32(wg_v[0].z) + i32(whole), wg_f[0]);
    }
}
