// Reduce pass: each workgroup folds whole chunks of the gradients into one
// Partial per chunk. Workgroups stride over this window's chunks, so the
// dispatch never exceeds the per-dimension limit and the result of a chunk
// does not depend on which workgroup took it: the sums are deterministic.

// Blue's thresholds and scales for f32 (Anderson 2017, adapted so that no
// single square exceeds 2^88 and a bin holds 2^40 of them without overflow).
const TSML_BITS: u32 = 0x20000000u; // 2^-63: below, scale up by 2^86
const TBIG_BITS: u32 = 0x55800000u; // 2^44: at or above, scale down by 2^-84

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

// Invocations step over a chunk by units (UNIT elements, one storage word
// for packed 16-bit types); the second element of a unit exists only when
// UNIT == 2 and it is inside the chunk (a tensor's odd tail has none).
fn has_second(i: u32, len: u32) -> bool {
    return UNIT == 2u && i + 1u < len;
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

// The body of the reduce entry points: this workgroup's chunks of the
// window, each folded into partials[c].
fn reduce_window(wg: u32, t: u32, kind: u32) {
    let range = window_chunks();
    let stride = stride_workgroups();
    for (var c = range.x + wg; c < range.y; c += stride) {
        let ch = chunk_at(c);
        var acc = vec3<f32>(0.0);
        var flags = 0u;
        for (var i = t * UNIT; i < ch.len; i += WG * UNIT) {
            let bits = load_unit(ch.start + i);
            add_element(kind, &acc, &flags, bits.x);
            if has_second(i, ch.len) {
                add_element(kind, &acc, &flags, bits.y);
            }
        }
        wg_v[t] = acc;
        wg_f[t] = flags;
        tree_reduce(t, kind);
        if t == 0u {
            partials[c] = Partial(wg_v[0], wg_f[0]);
        }
        workgroupBarrier();
    }
}

// reduce — reads: grads (this window's chunks), the plan's chunks, win, cfg.p.
// Writes: partials[c] for each chunk c of window_chunks(): for KIND 0 (L2)
// (small, medium, big) scaled sums of squares, for 1 (Inf) the bits of max
// |g| over finite g, for 2 (p) (s, m, E) = sum(|g|^p) relative to the largest
// |g| = m * 2^E; each with its FLAG_* bits.
// Dispatch: (stride_workgroups(), 1, 1), workgroups striding over window_chunks().
@compute @workgroup_size(WG)
fn reduce(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    reduce_window(wg.x, t, KIND);
}
