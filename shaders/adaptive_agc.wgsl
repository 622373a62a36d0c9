// AGC (Brock et al. 2021, NFNets; Optax adaptive_grad_clip): unit-wise
// clipping against the parameters. Each unit's gradient is scaled so that
// ‖g_unit‖ ≤ clipping · max(‖w_unit‖, eps), Optax's unitwise_clip exactly:
// kept where g_norm < max_norm, else multiplied by max_norm / max(g_norm, 1e-6).
//
// A tensor is seen as [P, R, Q] in row-major order; unit (p, q) is the R
// elements (p, 0..R, q) at stride Q. The host derives P, R, Q from the shape
// and the unit convention (Optax's unitwise_norm axes, or PyTorch rows).
// Stateless: nothing carries from step to step.

struct AgcParams {
    clipping: f32,
    eps: f32,
    tensors: u32,
    units: u32,  // units of all tensors
}

// Per tensor, 5 words: first unit, first element, P, R, Q.
struct TensorUnits {
    unit_begin: u32,
    offset: u32,
    p: u32,
    r: u32,
    q: u32,
}

// One unit's result, for the host to read when it asks.
struct UnitStat {
    grad_norm: f32,
    param_norm: f32,
    max_norm: f32,
    factor: f32, // 1: kept
}

@group(0) @binding(0) var<storage, read_write> grads: array<f32>;
@group(0) @binding(1) var<storage, read> params: array<f32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read_write> unit_stats: array<UnitStat>;
@group(0) @binding(4) var<uniform> prm: AgcParams;

const WG: u32 = 64u;
var<workgroup> g_sum: array<f32, WG>;
var<workgroup> p_sum: array<f32, WG>;

fn tensor_at(t: u32) -> TensorUnits {
    let i = 5u * t;
    return TensorUnits(table[i], table[i + 1u], table[i + 2u], table[i + 3u], table[i + 4u]);
}

// The tensor holding unit u: the last whose first unit is <= u.
fn tensor_of(u: u32) -> u32 {
    var lo = 0u;
    var hi = prm.tensors;
    while hi - lo > 1u {
        let mid = (lo + hi) / 2u;
        if table[5u * mid] <= u {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// A runtime float from its bits: a NaN constant expression is an error.
fn f32_from_bits(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}

// jnp.maximum: NaN if either is NaN (WGSL's max leaves that open).
fn maximum(a: f32, b: f32) -> f32 {
    if is_nan(a) || is_nan(b) {
        return f32_from_bits(0x7fc00000u);
    }
    return max(a, b);
}

// agc — reads: params and grads of each unit, the unit table. Writes: the
// unit's grads scaled in place, its UnitStat.
// Dispatch: (min(units, 65535), 1, 1); workgroups stride over the units.
@compute @workgroup_size(64)
fn agc(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    for (var u = wg.x; u < prm.units; u += nwg.x) {
        let t = tensor_at(tensor_of(u));
        let local = u - t.unit_begin;
        let pi = local / t.q;
        let qi = local % t.q;
        let base = t.offset + pi * t.r * t.q + qi;
        var gs = 0.0;
        var ps = 0.0;
        for (var r = lid; r < t.r; r += WG) {
            let e = base + r * t.q;
            let g = grads[e];
            let w = params[e];
            gs += g * g;
            ps += w * w;
        }
        g_sum[lid] = gs;
        p_sum[lid] = ps;
        workgroupBarrier();
        for (var half = WG / 2u; half > 0u; half /= 2u) {
            if lid < half {
                g_sum[lid] += g_sum[lid + half];
                p_sum[lid] += p_sum[lid + half];
            }
            workgroupBarrier();
        }
        let g_norm = sqrt(g_sum[0]);
        let p_norm = sqrt(p_sum[0]);
        let max_norm = prm.clipping * maximum(p_norm, prm.eps);
        var factor = 1.0;
        // NaN norms fail the test and give a NaN factor, as in Optax.
        if is_nan(g_norm) || is_nan(max_norm) || !(g_norm < max_norm) {
            factor = max_norm / maximum(g_norm, 1e-6);
        }
        // Everyone has read the sums before the next unit overwrites them.
        workgroupBarrier();
        if bitcast<u32>(factor) != 0x3f800000u {
            for (var r = lid; r < t.r; r += WG) {
                let e = base + r * t.q;
                grads[e] = grads[e] * factor;
            }
        }
        if lid == 0u {
            unit_stats[u] = UnitStat(g_norm, p_norm, max_norm, factor);
        }
    }
}
