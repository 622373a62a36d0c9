// Rooflines of the gradclip benchmark: the simplest kernels that move the
// bytes a clip moves (a read-only sum, an in-place multiply), so that each
// gradclip pass can be reported as a fraction of what a compute shader
// reaches on the same driver. Nothing here is gradclip's code. The shape of
// the loop comes from pipeline overrides; the bench times several shapes
// and keeps the fastest, so the roofline is the driver's, not one guess's.
//
// This file loads vec4<f32>; roofline_scalar.wgsl has the read and multiply
// kernels with scalar loads, to show what the load width is worth. The
// read with POW set is the power roofline, the floor of a general p's
// reduce: what the same read costs once every element is raised to p.
// The read with RECORDS set is the records roofline, the floor of a
// reduce with per-tensor results: gradclip writes one 16-byte record per
// tensor, which with one-element tensors is four times the bytes it reads,
// so the read alone is no floor for such a step.

// Invocations per workgroup; the final tree reduction halves it, so a power of two.
override WG: u32 = 256u;
// Independent accumulators per invocation, i.e. loads in flight: 1, 2, 4 or 8
// (and the stores per iteration of the records kernel's record loop).
override ACC: u32 = 4u;
// How invocations share the buffer. 0: grid stride over the whole buffer
// (neighbouring invocations read neighbouring elements, as GPUs want);
// 1: each workgroup strides through its own contiguous block; 2: each
// invocation reads its own contiguous run (what a CPU's prefetcher wants);
// 3: teams of TEAM neighbouring invocations each stride through their own
// contiguous run, neighbours reading neighbours (both at once, where a
// SIMD group of the CPU driver is one team and a GPU warp a few).
override WALK: u32 = 0u;
// Invocations per team of walk 3; divides WG.
override TEAM: u32 = 8u;
// read_vec4 sums |x|^params.p instead of x: the power roofline. An override
// rather than an entry point of its own, so that the two kernels cannot
// drift apart; the branch in term() is a constant once it is set, and
// every driver here folds it (the read's throughput is the same as with
// no branch at all, measured in the commit that made this one kernel).
override POW: bool = false;
// read_vec4 also writes records[0 .. params.records), one vec4<u32> each,
// after its read: the records roofline. Its share of the records is walk()
// over the record count, so the records go out in the same pattern the
// tuned shape reads in (contiguous per invocation or strided). Each record
// holds the invocation's sum, as gradclip's hold what its reduce found:
// no store can leave before the loads it depends on, nor can a driver
// drop them. An override for the same reason as POW: the read and the
// records kernel cannot drift apart.
override RECORDS: bool = false;

struct Params {
    len4: u32,    // vec4 elements the kernels cover
    len1: u32,    // the same as f32 elements (4 len4), for the scalar kernels
    factor: f32,  // the multiply kernel's constant
    p: f32,       // the exponent of the read's terms where POW is set
    records: u32, // records the read writes where RECORDS is set
    // A uniform's size is a multiple of 16 bytes; the host's Params matches.
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
// Written only under RECORDS, but a store guarded by an override is still a
// use of the binding: every read pipeline's layout has it, and the host
// binds the same buffer whether or not the pipeline writes it.
@group(0) @binding(4) var<storage, read_write> records: array<vec4<u32>>;

var<workgroup> wg_sum: array<f32, WG>;

// An invocation's walk: first index, end, stride.
struct Walk {
    first: u32,
    end: u32,
    stride: u32,
}

fn walk(wg: u32, groups: u32, lid: u32, len: u32) -> Walk {
    if WALK == 1u {
        let per = len / groups + select(0u, 1u, len % groups != 0u);
        let begin = min(wg * per, len);
        return Walk(begin + lid, min(begin + per, len), WG);
    }
    if WALK == 2u {
        let threads = groups * WG;
        let per = len / threads + select(0u, 1u, len % threads != 0u);
        let begin = min((wg * WG + lid) * per, len);
        return Walk(begin, min(begin + per, len), 1u);
    }
    if WALK == 3u {
        let teams = groups * (WG / TEAM);
        let per = (len / teams + select(0u, 1u, len % teams != 0u) + TEAM - 1u) / TEAM * TEAM;
        let begin = min((wg * (WG / TEAM) + lid / TEAM) * per, len);
        return Walk(begin + lid % TEAM, min(begin + per, len), TEAM);
    }
    return Walk(wg * WG + lid, len, groups * WG);
}

// Folds every invocation's value into partials[wg]: once per workgroup, so
// its barriers do not count against the bandwidth.
fn workgroup_total(wg: u32, lid: u32, v: f32) {
    wg_sum[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            wg_sum[lid] += wg_sum[lid + s];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        partials[wg] = wg_sum[0];
    }
}

// What read_vec4 sums for a loaded vec4: x, or |x|^p under POW (one pow,
// a log2 and an exp2 on every driver, per element, and no guard against
// over- or underflow: the simplest kernel a norm of general p can be).
fn term(x: vec4<f32>) -> vec4<f32> {
    if POW {
        return pow(abs(x), vec4(params.p));
    }
    return x;
}

// Record r of the records roofline: it depends on the sum its invocation
// read (bits), as a tensor's record depends on the tensor's elements.
fn put_record(r: u32, bits: u32) {
    records[r] = vec4(bits, r, 0u, 0u);
}

// read_vec4 — reads: src[0 .. params.len4). Writes: partials[wg] = the sum
// of term() of the vec4s its workgroup read, over their components; under
// RECORDS also records[0 .. params.records), record r = (bits of the sum of
// the invocation whose walk() over params.records holds r, r, 0, 0), every
// record once. Dispatch: (G, 1, 1), any G; each invocation keeps ACC vec4
// accumulators, ACC loads per iteration, then ACC record stores per
// iteration.
@compute @workgroup_size(WG)
fn read_vec4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let w = walk(wg.x, groups.x, lid, params.len4);
    let st = w.stride;
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
    var a3 = vec4<f32>();
    var a4 = vec4<f32>();
    var a5 = vec4<f32>();
    var a6 = vec4<f32>();
    var a7 = vec4<f32>();
    var i = w.first;
    // The ACC guards are constants once the overrides are set: the driver
    // sees straight-line code with exactly ACC independent loads.
    while i + (ACC - 1u) * st < w.end {
        a0 += term(src[i]);
        if ACC >= 2u {
            a1 += term(src[i + st]);
        }
        if ACC >= 4u {
            a2 += term(src[i + 2u * st]);
            a3 += term(src[i + 3u * st]);
        }
        if ACC >= 8u {
            a4 += term(src[i + 4u * st]);
            a5 += term(src[i + 5u * st]);
            a6 += term(src[i + 6u * st]);
            a7 += term(src[i + 7u * st]);
        }
        i += ACC * st;
    }
    for (; i < w.end; i += st) {
        a0 += term(src[i]);
    }
    let v = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    let sum = (v.x + v.y) + (v.z + v.w);
    if RECORDS {
        let rw = walk(wg.x, groups.x, lid, params.records);
        let rs = rw.stride;
        let bits = bitcast<u32>(sum);
        var r = rw.first;
        // ACC stores per iteration, as the loads: one store per iteration
        // took SwiftShader about 40% longer than four at 200 000 records
        // (lavapipe the same).
        while r + (ACC - 1u) * rs < rw.end {
            put_record(r, bits);
            if ACC >= 2u {
                put_record(r + rs, bits);
            }
            if ACC >= 4u {
                put_record(r + 2u * rs, bits);
                put_record(r + 3u * rs, bits);
            }
            if ACC >= 8u {
                put_record(r + 4u * rs, bits);
                put_record(r + 5u * rs, bits);
                put_record(r + 6u * rs, bits);
                put_record(r + 7u * rs, bits);
            }
            r += ACC * rs;
        }
        for (; r < rw.end; r += rs) {
            put_record(r, bits);
        }
    }
    workgroup_total(wg.x, lid, sum);
}

// mul_vec4 — reads and writes: dst[0 .. params.len4), multiplied by
// params.factor in place. Dispatch: (G, 1, 1), any G; each invocation
// issues ACC loads before its ACC stores.
@compute @workgroup_size(WG)
fn mul_vec4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let w = walk(wg.x, groups.x, lid, params.len4);
    let st = w.stride;
    let f = params.factor;
    var i = w.first;
    while i + (ACC - 1u) * st < w.end {
        let v0 = dst[i];
        var v1 = vec4<f32>();
        var v2 = vec4<f32>();
        var v3 = vec4<f32>();
        var v4 = vec4<f32>();
        var v5 = vec4<f32>();
        var v6 = vec4<f32>();
        var v7 = vec4<f32>();
        if ACC >= 2u {
            v1 = dst[i + st];
        }
        if ACC >= 4u {
            v2 = dst[i + 2u * st];
            v3 = dst[i + 3u * st];
        }
        if ACC >= 8u {
            v4 = dst[i + 4u * st];
            v5 = dst[i + 5u * st];
            v6 = dst[i + 6u * st];
            v7 = dst[i + 7u * st];
        }
        dst[i] = v0 * f;
        if ACC >= 2u {
            dst[i + st] = v1 * f;
        }
        if ACC >= 4u {
            dst[i + 2u * st] = v2 * f;
            dst[i + 3u * st] = v3 * f;
        }
        if ACC >= 8u {
            dst[i + 4u * st] = v4 * f;
            dst[i + 5u * st] = v5 * f;
            dst[i + 6u * st] = v6 * f;
            dst[i + 7u * st] = v7 * f;
        }
        i += ACC * st;
    }
    for (; i < w.end; i += st) {
        dst[i] = dst[i] * f;
    }
}
