// Finalize pass: one workgroup folds every chunk's Partial in a fixed order
// into the total (per-tensor norms and coefficients, when asked for, come
// from the reduce pass for fused tensors and from tensor_stats, spread
// over the device, just before, for the others), turns the total
// into the clip factor with the requested semantics, and writes Stats: the
// state (including the scale pass's indirect dispatch, zero workgroups when
// nothing needs to change) and the step's entry of the report log. Reduction kinds: 0 = L2, 1 = Inf, 2 = general p.

// The scale pass's indirect arguments, written with stats.state.dispatch:
// that pass reads them from here, a buffer its bind groups leave out,
// because a dispatch may not take its arguments from a buffer it can write.
@group(0) @binding(6) var<storage, read_write> scale_dispatch: array<u32, 3>;

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

// Tensors an invocation takes between two passes over its queue of those
// that tensor_clip cannot take (a bit each in a u32): as many as the
// queue holds, for the host that gives an invocation that many.
const STAT_BLOCK: u32 = 32u;

// Tensor i's partial: its segments' partials, folded in finalize's order.
fn tensor_partial(i: u32) -> Partial {
    let range = tensor_partials(i);
    return fold_short(KIND, range.x, range.y);
}

// tensor_stats — reads: the partials of the segments of the tensors on
// the split list (split_tensor: not fused, for the reduce pass stored
// those tensors' results itself, and not long), the plan's per-tensor
// ranges, cfg, stats.state's loss scale (before finalize updates it).
// Writes: stats.tensors of those tensors (norm and factor), and
// stats.tensors_clipped = cfg.step when some factor is not 1.
// Dispatch: (min(ceil(split tensors / (WG * k)), the host's cap), 1, 1),
// none when the list is empty, with k = 8 or STAT_BLOCK on CPU adapters
// (the host's choice) and 1 on others, invocations striding over the
// list, up to STAT_BLOCK at a time; recorded between the reduce and
// finalize passes when the clip asks for per-tensor results. Every tensor's result depends only on its
// own partials, folded in finalize's order (fold_short).
@compute @workgroup_size(WG)
fn tensor_stats(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let sc = stat_scale();
    let stride = groups.x * WG;
    var clipped = false;
    for (var base = id.x; base < win.split_count; base += STAT_BLOCK * stride) {
        // Plain tensors now; the others queued as bits, then taken by
        // clip_of in a loop that costs nothing much when the queue is empty.
        var queue = 0u;
        for (var j = 0u; j < STAT_BLOCK && base + j * stride < win.split_count; j++) {
            let i = split_tensor(base + j * stride);
            let pc = tensor_clip(tensor_partial(i), sc.unscaling);
            if pc.ok {
                clipped = store_tensor_stat(i, pc.c) || clipped;
            } else {
                queue |= 1u << j;
            }
        }
        while queue != 0u {
            let j = firstTrailingBit(queue);
            queue &= queue - 1u;
            let i = split_tensor(base + j * stride);
            clipped = store_general_stat(i, tensor_partial(i), sc) || clipped;
        }
    }
    mark_clipped(clipped);
}

// long_tensor_stats — reads: the partials of the segments of the tensors on
// the long list (long_tensor: of more partials than WG), the plan's
// per-tensor ranges, cfg, stats.state's loss scale (before finalize
// updates it). Writes: stats.tensors of those tensors, and
// stats.tensors_clipped = cfg.step when some factor is not 1.
// Dispatch: (min(long tensors, the host's cap), 1, 1), none when the list
// is empty, workgroups striding over the list, each folding one tensor at
// a time as finalize folds the chunks, the order fold_short gives the
// split list's tensors in tensor_stats; recorded
// with tensor_stats. An entry point of its own: a barrier anywhere in an
// entry point costs lavapipe on every invocation (with this loop in
// tensor_stats, 10 000 tensors' tensor_stats took 460 us against 375, p =
// 1.5 785 against 620).
@compute @workgroup_size(WG)
fn long_tensor_stats(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let sc = stat_scale();
    var clipped = false;
    for (var k = wg.x; k < win.long_count; k += groups.x) {
        let i = long_tensor(k);
        let range = tensor_partials(i);
        let q = fold_workgroup(t, KIND, range.x, range.y);
        if t == 0u {
            clipped = store_general_stat(i, q, sc) || clipped;
        }
    }
    mark_clipped(clipped);
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

// Writes this clip's entry of the report log, unless its slot holds a
// newer step. Steps are numbered when they are recorded, and threads may
// submit their encoders in any order, so a step can run after a newer one
// of its slot (LOG_LEN steps on): it is then the one lost, which the host
// counts as dropped, instead of hiding the newer step from every read.
// Step numbers are the low 32 bits of the host's, compared modulo 2^32; 0
// is a slot never written.
fn write_log(e: LogEntry) {
    let i = cfg.step % LOG_LEN;
    let held = stats.log[i].state.step;
    if held == 0u || i32(cfg.step - held) >= 0 {
        stats.log[i] = e;
    }
}

// The step's state, with its scale dispatch also where the scale pass
// reads it (scale_dispatch).
fn store_state(st: ClipState) {
    stats.state = st;
    scale_dispatch = st.dispatch;
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
        st.scale_kind = CLIP_SCALE_MULTIPLY;
        st.coefficient = 1.0;
        st.coef_mant = 1.0;
        st.coef_exp = 0;
        st.found_inf = 0u;
        st.unscaled_by = 1.0;
        st.dispatch = array<u32, 3>(0u, 1u, 1u);
        store_state(st);
        write_log(LogEntry(st, q));
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
    var scale = c.scale_kind != CLIP_SCALE_MULTIPLY || !is_one(factor);
    if (cfg.flags & CFG_PER_TENSOR) != 0u {
        // The report's factor stays the global one; the gradients get their tensor's.
        st.scale_kind = CLIP_SCALE_PER_TENSOR;
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
        st.scale_kind = CLIP_SCALE_MULTIPLY;
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
    store_state(st);
    write_log(LogEntry(st, q));
}

// finalize — reads: partials of all_chunks() from the reduce pass, cfg,
// stats.state's loss scale and stats.scaler, and when cfg.flags asks for
// per-tensor results stats.tensors_clipped (from tensor_stats).
// Writes: stats.state, scale_dispatch, stats.partial,
// stats.log[cfg.step % LOG_LEN], and stats.tensors_step when per-tensor
// results were asked for.
// Dispatch: (1, 1, 1). The reduction kind is the pipeline override KIND.
@compute @workgroup_size(WG)
fn finalize(@builtin(local_invocation_index) t: u32) {
    let range = all_chunks();
    let total = fold_workgroup(t, KIND, range.x, range.y);
    if t == 0u {
        var per_tensor_clips = false;
        if per_tensor_chunks() {
            // tensor_stats ran just before, for this step (norm clips
            // number their steps from 1, so the initial 0 matches none).
            stats.tensors_step = cfg.step;
            per_tensor_clips = atomicLoad(&stats.tensors_clipped) == cfg.step;
        }
        stats.partial = total;
        finish(total, KIND, per_tensor_clips);
    }
}

// finish_supplied — reads: cfg.supplied (a total combined across shards,
// recorded by the host or copied from the caller's buffer), cfg, stats.state's
// loss scale and stats.scaler. Writes: stats.state, scale_dispatch, stats.partial,
// stats.log[cfg.step % LOG_LEN].
// Dispatch: (1, 1, 1); one invocation works. The reduction kind is the pipeline override KIND.
@compute @workgroup_size(WG)
fn finish_supplied(@builtin(local_invocation_index) t: u32) {
    if t == 0u {
        stats.partial = cfg.supplied;
        finish(cfg.supplied, KIND, false);
    }
}
