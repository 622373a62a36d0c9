// The cost of a per-chunk reduction, for the benchmark's sweep: every
// workgroup walks chunks of K4 vec4s (chunk c, c + G, ...) and folds each
// chunk to one partial, as a reduce pass that reports per-chunk partials
// must. chunks_none folds nothing per chunk (its time is the walk alone);
// the difference to it is what the per-chunk reduction costs.
// chunks_subgroup.wgsl has the same walk with subgroup reductions.

override WG: u32 = 256u;
// Accumulators per invocation within a chunk: 1, 2 or 4.
override ACC: u32 = 4u;
// vec4 elements per chunk (K / 4).
override K4: u32 = 2048u;
// How the invocations share a chunk, as roofline.wgsl's WALK: 0 (or 1):
// stride WG; 2: a contiguous run each; 3: teams of TEAM, a run per team.
override WALK: u32 = 0u;
override TEAM: u32 = 8u;

struct Params {
    len4: u32,   // vec4 elements
    chunks: u32, // ceil(len4 / K4)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

var<workgroup> wg_sum: array<f32, WG>;

// This invocation's sum of chunk c.
fn chunk_sum(c: u32, lid: u32) -> f32 {
    let chunk_end = min((c + 1u) * K4, params.len4);
    // K4 is a multiple of WG (the bench only makes such pipelines), so
    // every run below has whole teams.
    var i = c * K4 + lid;
    var end = chunk_end;
    var st = WG;
    if WALK == 2u {
        let per = K4 / WG;
        i = min(c * K4 + lid * per, chunk_end);
        end = min(i + per, chunk_end);
        st = 1u;
    }
    if WALK == 3u {
        let per = K4 / (WG / TEAM);
        let begin = min(c * K4 + (lid / TEAM) * per, chunk_end);
        i = begin + lid % TEAM;
        end = min(begin + per, chunk_end);
        st = TEAM;
    }
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
    var a3 = vec4<f32>();
    while i + (ACC - 1u) * st < end {
        a0 += src[i];
        if ACC >= 2u {
            a1 += src[i + st];
        }
        if ACC >= 4u {
            a2 += src[i + 2u * st];
            a3 += src[i + 3u * st];
        }
        i += ACC * st;
    }
    for (; i < end; i += st) {
        a0 += src[i];
    }
    let v = (a0 + a1) + (a2 + a3);
    return (v.x + v.y) + (v.z + v.w);
}

// The workgroup's tree in workgroup memory: 1 + log2(WG) barriers.
fn tree(lid: u32, v: f32) -> f32 {
    wg_sum[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            wg_sum[lid] += wg_sum[lid + s];
        }
        workgroupBarrier();
    }
    return wg_sum[0];
}

// chunks_tree — reads: src[0 .. params.len4). Writes: partials[c] = the sum
// of chunk c, for every chunk. Dispatch: (G, 1, 1), any G; workgroup w
// takes chunks w, w + G, ...; one tree reduction per chunk.
@compute @workgroup_size(WG)
fn chunks_tree(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    for (var c = wg.x; c < params.chunks; c += groups.x) {
        let total = tree(lid, chunk_sum(c, lid));
        if lid == 0u {
            partials[c] = total;
        }
    }
}

// chunks_none — reads: src[0 .. params.len4). Writes: partials[wg] = the
// sum of all its chunks. Dispatch: (G, 1, 1); the walk of chunks_tree with
// one tree at the end instead of one per chunk.
@compute @workgroup_size(WG)
fn chunks_none(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    var acc = 0.0;
    for (var c = wg.x; c < params.chunks; c += groups.x) {
        acc += chunk_sum(c, lid);
    }
    let total = tree(lid, acc);
    if lid == 0u {
        partials[wg.x] = total;
    }
}
