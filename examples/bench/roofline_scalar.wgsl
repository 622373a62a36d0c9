// The rooflines of roofline.wgsl with scalar loads from an array<f32>, for
// the benchmark's sweep: what vec4 loads are worth on each driver. Same
// overrides, bindings and dispatch shapes as roofline.wgsl, less POW,
// RECORDS and the records' binding 4, which only its vec4 read has.

override WG: u32 = 256u;
override ACC: u32 = 4u;
override WALK: u32 = 0u;
override TEAM: u32 = 8u;

struct Params {
    len4: u32,    // vec4 elements (read_scalar4, mul_scalar4)
    len1: u32,    // f32 elements, 4 len4 (read_scalar1, mul_scalar1)
    factor: f32,
    p: f32,       // the exponent of roofline.wgsl's read under POW; unused here
    records: u32, // roofline.wgsl's record count under RECORDS; unused here
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

var<workgroup> wg_sum: array<f32, WG>;

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

// Four scalar loads of the vec4 at index j.
fn quad(j: u32) -> vec4<f32> {
    let k = 4u * j;
    return vec4<f32>(src[k], src[k + 1u], src[k + 2u], src[k + 3u]);
}

// read_scalar4 — reads: src[0 .. 4 params.len4). Writes: partials[wg], the
// sum its workgroup read. Dispatch: (G, 1, 1). read_vec4's walk and
// arithmetic, each vec4 fetched as four f32 loads.
@compute @workgroup_size(WG)
fn read_scalar4(
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
    while i + (ACC - 1u) * st < w.end {
        a0 += quad(i);
        if ACC >= 2u {
            a1 += quad(i + st);
        }
        if ACC >= 4u {
            a2 += quad(i + 2u * st);
            a3 += quad(i + 3u * st);
        }
        if ACC >= 8u {
            a4 += quad(i + 4u * st);
            a5 += quad(i + 5u * st);
            a6 += quad(i + 6u * st);
            a7 += quad(i + 7u * st);
        }
        i += ACC * st;
    }
    for (; i < w.end; i += st) {
        a0 += quad(i);
    }
    let v = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    workgroup_total(wg.x, lid, (v.x + v.y) + (v.z + v.w));
}

// read_scalar1 — reads: src[0 .. params.len1). Writes: partials[wg].
// Dispatch: (G, 1, 1). One f32 per load, ACC scalar accumulators.
@compute @workgroup_size(WG)
fn read_scalar1(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let w = walk(wg.x, groups.x, lid, params.len1);
    let st = w.stride;
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    var a4 = 0.0;
    var a5 = 0.0;
    var a6 = 0.0;
    var a7 = 0.0;
    var i = w.first;
    while i + (ACC - 1u) * st < w.end {
        a0 += src[i];
        if ACC >= 2u {
            a1 += src[i + st];
        }
        if ACC >= 4u {
            a2 += src[i + 2u * st];
            a3 += src[i + 3u * st];
        }
        if ACC >= 8u {
            a4 += src[i + 4u * st];
            a5 += src[i + 5u * st];
            a6 += src[i + 6u * st];
            a7 += src[i + 7u * st];
        }
        i += ACC * st;
    }
    for (; i < w.end; i += st) {
        a0 += src[i];
    }
    workgroup_total(wg.x, lid, ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)));
}

fn store_quad(j: u32, v: vec4<f32>) {
    let k = 4u * j;
    dst[k] = v.x;
    dst[k + 1u] = v.y;
    dst[k + 2u] = v.z;
    dst[k + 3u] = v.w;
}

fn load_quad(j: u32) -> vec4<f32> {
    let k = 4u * j;
    return vec4<f32>(dst[k], dst[k + 1u], dst[k + 2u], dst[k + 3u]);
}

// mul_scalar4 — reads and writes: dst[0 .. 4 params.len4), multiplied by
// params.factor in place. Dispatch: (G, 1, 1). mul_vec4 with each vec4
// moved as four f32 loads and four f32 stores.
@compute @workgroup_size(WG)
fn mul_scalar4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let w = walk(wg.x, groups.x, lid, params.len4);
    let st = w.stride;
    let f = params.factor;
    var i = w.first;
    while i + (ACC - 1u) * st < w.end {
        let v0 = load_quad(i);
        var v1 = vec4<f32>();
        var v2 = vec4<f32>();
        var v3 = vec4<f32>();
        var v4 = vec4<f32>();
        var v5 = vec4<f32>();
        var v6 = vec4<f32>();
        var v7 = vec4<f32>();
        if ACC >= 2u {
            v1 = load_quad(i + st);
        }
        if ACC >= 4u {
            v2 = load_quad(i + 2u * st);
            v3 = load_quad(i + 3u * st);
        }
        if ACC >= 8u {
            v4 = load_quad(i + 4u * st);
            v5 = load_quad(i + 5u * st);
            v6 = load_quad(i + 6u * st);
            v7 = load_quad(i + 7u * st);
        }
        store_quad(i, v0 * f);
        if ACC >= 2u {
            store_quad(i + st, v1 * f);
        }
        if ACC >= 4u {
            store_quad(i + 2u * st, v2 * f);
            store_quad(i + 3u * st, v3 * f);
        }
        if ACC >= 8u {
            store_quad(i + 4u * st, v4 * f);
            store_quad(i + 5u * st, v5 * f);
            store_quad(i + 6u * st, v6 * f);
            store_quad(i + 7u * st, v7 * f);
        }
        i += ACC * st;
    }
    for (; i < w.end; i += st) {
        store_quad(i, load_quad(i) * f);
    }
}

// mul_scalar1 — reads and writes: dst[0 .. params.len1), multiplied by
// params.factor in place. Dispatch: (G, 1, 1). One f32 per load and store.
@compute @workgroup_size(WG)
fn mul_scalar1(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let w = walk(wg.x, groups.x, lid, params.len1);
    let st = w.stride;
    let f = params.factor;
    var i = w.first;
    while i + (ACC - 1u) * st < w.end {
        let v0 = dst[i];
        var v1 = 0.0;
        var v2 = 0.0;
        var v3 = 0.0;
        var v4 = 0.0;
        var v5 = 0.0;
        var v6 = 0.0;
        var v7 = 0.0;
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
