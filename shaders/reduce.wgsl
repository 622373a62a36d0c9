// Reduce pass: each workgroup folds whole chunks of the gradients into one
// Partial per chunk. Workgroups stride over this window's chunks, so the
// dispatch never exceeds the per-dimension limit and the result of a chunk
// does not depend on which workgroup took it: the sums are deterministic.

// Blue's thresholds and scales for f32 (Anderson 2017, adapted so that no
// single square exceeds 2^88 and a bin holds 2^40 of them without overflow).
const TSML_BITS: u32 = 0x20000000u; // 2^-63: below, scale up by 2^86
const TBIG_BITS: u32 = 0x55800000u; // 2^44: at or above, scale down by 2^-84

// Element i of chunk c with its window offset applied.
fn chunk_elem(ch: Chunk, i: u32) -> u32 {
    return bitcast<u32>(grads[ch.start + i]);
}

// reduce_l2 — reads: grads (this window's chunks), chunks, win.
// Writes: partials[c] = (small, medium, big) scaled sums of squares + flags.
// Dispatch: (stride_workgroups(), 1, 1), workgroups striding over window_chunks().
@compute @workgroup_size(WG)
fn reduce_l2(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg.x; c < range.y; c += stride) {
        let ch = chunks[c];
        var acc = vec3<f32>(0.0);
        var flags = 0u;
        for (var i = t; i < ch.len; i += WG) {
            let a = chunk_elem(ch, i) & ABS_MASK;
            if a >= EXP_MASK {
                flags |= nonfinite_flags(a);
            } else if a >= TBIG_BITS {
                let y = bitcast<f32>(a - (84u << 23u)); // |g| * 2^-84, exactly
                acc.z += y * y;
            } else if a >= TSML_BITS {
                let y = bitcast<f32>(a);
                acc.y += y * y;
            } else if a != 0u {
                // |g| * 2^86 exactly; subnormals are rebuilt from their
                // mantissa (mant * 2^-149 * 2^86) so that no flush loses them.
                let y = select(bitcast<f32>(a + (86u << 23u)), f32(a) * 0x1p-63f, a < 0x00800000u);
                acc.x += y * y;
            }
        }
        wg_v[t] = acc;
        wg_f[t] = flags;
        tree_reduce(t, 0u);
        if t == 0u {
            partials[c] = Partial(wg_v[0], wg_f[0]);
        }
        workgroupBarrier();
    }
}

// reduce_inf — reads: grads (this window's chunks), chunks, win.
// Writes: partials[c].v.x = bits of max |g| over finite g (bit order is value
// order for non-negative floats, so no float compare is needed) + flags.
// Dispatch: (stride_workgroups(), 1, 1), workgroups striding over window_chunks().
@compute @workgroup_size(WG)
fn reduce_inf(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg.x; c < range.y; c += stride) {
        let ch = chunks[c];
        var best = 0u;
        var flags = 0u;
        for (var i = t; i < ch.len; i += WG) {
            let a = chunk_elem(ch, i) & ABS_MASK;
            if a >= EXP_MASK {
                flags |= nonfinite_flags(a);
            } else {
                best = max(best, a);
            }
        }
        wg_v[t] = vec3(bitcast<f32>(best), 0.0, 0.0);
        wg_f[t] = flags;
        tree_reduce(t, 1u);
        if t == 0u {
            partials[c] = Partial(wg_v[0], wg_f[0]);
        }
        workgroupBarrier();
    }
}

// reduce_p — reads: grads (this window's chunks), chunks, win, cfg.p.
// Writes: partials[c] = (s, m, E): sum(|g|^p) relative to the largest |g| = m * 2^E + flags.
// Dispatch: (stride_workgroups(), 1, 1), workgroups striding over window_chunks().
@compute @workgroup_size(WG)
fn reduce_p(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let p = cfg.p;
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg.x; c < range.y; c += stride) {
        let ch = chunks[c];
        var acc = vec3<f32>(0.0);
        var flags = 0u;
        for (var i = t; i < ch.len; i += WG) {
            let a = chunk_elem(ch, i) & ABS_MASK;
            if a >= EXP_MASK {
                flags |= nonfinite_flags(a);
            } else if a != 0u {
                let d = decode(a);
                acc = merge_p(acc, vec3(1.0, d.m, f32(d.e)), p);
            }
        }
        wg_v[t] = acc;
        wg_f[t] = flags;
        tree_reduce(t, 2u);
        if t == 0u {
            partials[c] = Partial(wg_v[0], wg_f[0]);
        }
        workgroupBarrier();
    }
}
