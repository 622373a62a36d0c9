// Adaptive thresholds (ZClip, AutoClip) computed on the GPU from state kept
// on the GPU, between a set's record_norm and its clip with the recorded
// partial. The host prepends clip_state.wgsl (ClipState), bits.wgsl and
// adaptive_records.wgsl (AdaptiveParams, AdaptiveState). The
// threshold is written to AdaptiveState.max_norm, which the host copies into
// the set's ClipConfig.max_norm before the clip's finish dispatch: no value
// ever goes through the host.
//
// A step whose norm is NaN or infinite leaves every statistic as it was, so
// one bad batch cannot poison the EMA or the history.

// As a hex literal: Tint rejects the decimal 3.40282347e+38 as not representable.
const F32_MAX: f32 = 0x1.fffffep+127f;

@group(0) @binding(0) var<storage, read> clip: ClipState;
@group(0) @binding(1) var<storage, read_write> st: AdaptiveState;
@group(0) @binding(2) var<uniform> prm: AdaptiveParams;

fn cap() -> f32 {
    if (prm.flags & P_HAS_CAP) != 0u {
        return prm.cap;
    }
    return f32_from_bits(POS_INF);
}

fn publish(g: f32, threshold: f32, boundary: f32, decision: u32) {
    st.norm = g;
    st.threshold = threshold;
    st.boundary = boundary;
    var d = decision;
    if is_finite_f32(g) && g > threshold {
        d |= D_CLIPPED;
    }
    st.decision = d;
    st.max_norm = select(F32_MAX, max(threshold, 0.0), is_finite_f32(threshold));
    st.recorded += 1u;
}

// ZClip (Kumar et al. 2025), after the authors' zclip.py: warm-up norms are
// collected, then their mean and (population) variance start an EMA; a norm
// whose z-score exceeds z_thresh is a spike and is clipped; the EMA is then
// updated with the value the spike was clipped to (or left alone).
fn zclip_step(g: f32) {
    let c = cap();
    if !is_finite_f32(g) {
        var boundary = c;
        if st.ema_ready != 0u {
            boundary = min(boundary, st.mean + prm.z_thresh * (sqrt(st.variance) + prm.eps));
        }
        publish(g, c, boundary, D_SKIPPED);
        return;
    }
    st.steps += 1u;
    if st.ema_ready == 0u {
        st.history[st.count] = bitcast<u32>(g);
        st.count += 1u;
        if st.count >= prm.warmup {
            let n = f32(st.count);
            var sum = 0.0;
            for (var i = 0u; i < st.count; i++) {
                sum += bitcast<f32>(st.history[i]);
            }
            let mean = sum / n;
            var sq = 0.0;
            for (var i = 0u; i < st.count; i++) {
                let d = bitcast<f32>(st.history[i]) - mean;
                sq += d * d;
            }
            st.mean = mean;
            st.variance = sq / n;
            st.ema_ready = 1u;
            st.count = 0u;
        }
        publish(g, c, c, D_WARMUP);
        return;
    }
    let mean = st.mean;
    let sd = sqrt(st.variance);
    var spike = false;
    var clip_to = 0.0;
    var boundary = 0.0;
    if (prm.flags & P_PERCENTILE_MODE) != 0u {
        boundary = mean + prm.z_thresh * sd;
        spike = g > boundary;
        clip_to = boundary;
    } else {
        let z = (g - mean) / (sd + prm.eps);
        boundary = mean + prm.z_thresh * (sd + prm.eps);
        spike = z > prm.z_thresh;
        if (prm.flags & P_CLIP_TO_MEAN) != 0u {
            clip_to = mean;
        } else {
            let eta = z / prm.z_thresh;
            clip_to = (mean + (prm.z_thresh * sd) / eta) * prm.clip_factor;
        }
    }
    var threshold = c;
    if spike {
        threshold = min(clip_to, c);
    }
    if !(spike && (prm.flags & P_SKIP_ON_SPIKE) != 0u) {
        let x = select(g, clip_to, spike);
        let a = prm.alpha;
        let m = a * mean + (1.0 - a) * x;
        let d = x - m;
        st.mean = m;
        st.variance = a * st.variance + (1.0 - a) * d * d;
    }
    publish(g, threshold, min(boundary, c), select(0u, D_SPIKE, spike));
}

// AutoClip's selection, one workgroup.
const AUTO_WG: u32 = 64u;
var<workgroup> sel: array<f32, 2>;
var<workgroup> window_len: u32;

fn histogram() -> bool {
    return (prm.flags & P_HISTOGRAM) != 0u;
}

fn push_norm(g: f32) {
    if histogram() {
        // g is finite and not negative (a -0 counts as 0): its bits order as it does.
        st.history[(bitcast<u32>(g) & ABS_MASK) >> prm.bucket_shift] += 1u;
        st.count += 1u;
        return;
    }
    st.history[st.head] = bitcast<u32>(g);
    st.head = (st.head + 1u) % prm.capacity;
    st.count = min(st.count + 1u, prm.capacity);
}

// numpy's default percentile (linear interpolation between the order
// statistics ⌊h⌋ and ⌊h⌋ + 1, h = (n - 1) · p / 100) of the window, by exact
// selection: each invocation ranks its norms against all others (ties broken
// by slot, so every rank is held by exactly one norm). With P_HISTOGRAM, of
// all norms so far, each floored to its bucket's lower edge (the f32 bits
// with bucket_shift low bits cleared): below the exact percentile by less
// than a relative 2^-(23 - bucket_shift).
fn autoclip_percentile(lid: u32, n: u32) -> f32 {
    let h = f32(n - 1u) * (prm.percentile / 100.0);
    let lo = min(u32(floor(h)), n - 1u);
    let frac = h - floor(h);
    if histogram() {
        select_buckets(lid, lo);
    } else {
        select_exact(lid, n, lo);
    }
    workgroupBarrier();
    if lo + 1u >= n || frac == 0.0 {
        return sel[0];
    }
    return sel[0] + frac * (sel[1] - sel[0]);
}

// sel[0], sel[1] = the window's order statistics lo and lo + 1.
fn select_exact(lid: u32, n: u32, lo: u32) {
    for (var i = lid; i < n; i += AUTO_WG) {
        let x = bitcast<f32>(st.history[i]);
        var rank = 0u;
        for (var j = 0u; j < n; j++) {
            let y = bitcast<f32>(st.history[j]);
            if y < x || (y == x && j < i) {
                rank += 1u;
            }
        }
        if rank == lo {
            sel[0] = x;
        }
        if rank == lo + 1u {
            sel[1] = x;
        }
    }
}

var<workgroup> block_count: array<u32, AUTO_WG>;

// sel[0], sel[1] = the lower edges of the buckets holding the order
// statistics lo and lo + 1 of all norms counted: each invocation counts a
// contiguous block of buckets, finds how many norms lie below its block, and
// the block(s) holding either rank walk their buckets.
fn select_buckets(lid: u32, lo: u32) {
    let per = (prm.capacity + AUTO_WG - 1u) / AUTO_WG;
    let b0 = min(lid * per, prm.capacity);
    let b1 = min(b0 + per, prm.capacity);
    var mine = 0u;
    for (var b = b0; b < b1; b++) {
        mine += st.history[b];
    }
    block_count[lid] = mine;
    workgroupBarrier();
    var c = 0u;
    for (var i = 0u; i < lid; i++) {
        c += block_count[i];
    }
    if lo + 1u < c || lo >= c + mine {
        return;
    }
    for (var b = b0; b < b1; b++) {
        let k = st.history[b];
        let edge = bitcast<f32>(b << prm.bucket_shift);
        if lo >= c && lo < c + k {
            sel[0] = edge;
        }
        if lo + 1u >= c && lo + 1u < c + k {
            sel[1] = edge;
        }
        c += k;
    }
}

// AutoClip (Seetharaman et al. 2020): the threshold is the p-th percentile
// of the norms seen (the last `capacity` of them).
fn autoclip_step(lid: u32) {
    let g = clip.total_norm;
    let ok = is_finite_f32(g);
    let include = (prm.flags & P_INCLUDE_CURRENT) != 0u;
    if lid == 0u {
        if ok && include {
            push_norm(g);
        }
        window_len = st.count;
    }
    // The push must be visible to every invocation, and the count uniform.
    storageBarrier();
    let n = workgroupUniformLoad(&window_len);
    var threshold = f32_from_bits(POS_INF);
    if n > 0u {
        threshold = autoclip_percentile(lid, n);
    }
    if lid == 0u {
        if ok {
            st.steps += 1u;
            if !include {
                push_norm(g);
            }
        }
        var decision = 0u;
        if !ok {
            decision = D_SKIPPED;
        } else if g > threshold {
            decision = D_SPIKE;
        }
        publish(g, threshold, threshold, decision);
    }
}

// adaptive_step — reads: the norm the set's record_norm left in clip
// (ClipState), st, prm. Writes: st (EMA or history, and the threshold that
// the clip then copies into its max_norm). Dispatch: one workgroup.
@compute @workgroup_size(64)
fn adaptive_step(@builtin(local_invocation_index) lid: u32) {
    if prm.method == METHOD_AUTOCLIP {
        autoclip_step(lid);
        return;
    }
    if lid == 0u {
        zclip_step(clip.total_norm);
    }
}
