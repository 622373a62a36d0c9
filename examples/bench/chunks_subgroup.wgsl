// chunks.wgsl's per-chunk reduction with subgroup operations, for devices
// with Features::SUBGROUP: a subgroup sum, one workgroup-memory slot per
// subgroup, two barriers per chunk whatever the workgroup size.

override WG: u32 = 256u;
override ACC: u32 = 4u;
override K4: u32 = 2048u;
override WALK: u32 = 0u;
override TEAM: u32 = 8u;

struct Params {
    len4: u32,
    chunks: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

// One slot per subgroup: at most WG / 4 (WebGPU's smallest subgroup), but
// sized WG so that any reported subgroup size fits.
var<workgroup> sg_sums: array<f32, WG>;

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

// Butterfly sum over the subgroup: log2(size) shuffles, every lane ends
// with the total.
fn butterfly(v: f32, size: u32) -> f32 {
    var x = v;
    for (var m = size / 2u; m > 0u; m >>= 1u) {
        x += subgroupShuffleXor(x, m);
    }
    return x;
}

// chunks_subgroup_add — reads: src[0 .. params.len4). Writes: partials[c],
// the sum of chunk c. Dispatch: (G, 1, 1); workgroup w takes chunks w,
// w + G, ...; subgroupAdd, then the first subgroup adds the subgroups' sums.
@compute @workgroup_size(WG)
fn chunks_subgroup_add(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) count: u32,
) {
    for (var c = wg.x; c < params.chunks; c += groups.x) {
        let s = subgroupAdd(chunk_sum(c, lid));
        if lane == 0u {
            sg_sums[sg] = s;
        }
        workgroupBarrier();
        if sg == 0u {
            var t = 0.0;
            for (var k = lane; k < count; k += size) {
                t += sg_sums[k];
            }
            t = subgroupAdd(t);
            if lane == 0u {
                partials[c] = t;
            }
        }
        workgroupBarrier();
    }
}

// chunks_shuffle — reads: src[0 .. params.len4). Writes: partials[c].
// Dispatch: (G, 1, 1); chunks_subgroup_add with subgroupShuffleXor
// butterflies in place of subgroupAdd.
@compute @workgroup_size(WG)
fn chunks_shuffle(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) count: u32,
) {
    for (var c = wg.x; c < params.chunks; c += groups.x) {
        let s = butterfly(chunk_sum(c, lid), size);
        if lane == 0u {
            sg_sums[sg] = s;
        }
        workgroupBarrier();
        if sg == 0u {
            var t = 0.0;
            for (var k = lane; k < count; k += size) {
                t += sg_sums[k];
            }
            t = butterfly(t, size);
            if lane == 0u {
                partials[c] = t;
            }
        }
        workgroupBarrier();
    }
}
