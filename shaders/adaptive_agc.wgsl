// AGC (Brock et al. 2021, NFNets; Optax adaptive_grad_clip): unit-wise
// clipping against the parameters. Each unit's gradient is scaled so that
// ‖g_unit‖ ≤ clipping · max(‖w_unit‖, eps), Optax's unitwise_clip exactly:
// kept where g_norm < max_norm, else multiplied by max_norm / max(g_norm, 1e-6).
//
// A tensor is seen as [P, R, Q] in row-major order; unit (p, q) is the R
// elements (p, 0..R, q) at stride Q. The host derives P, R, Q from the shape
// and the unit convention (Optax's unitwise_norm axes, or PyTorch rows).
// Stateless: nothing carries from step to step.
//
// Two passes: agc_norms (a workgroup per unit) finds every unit's factor,
// agc_scale (an invocation per 32-bit word) applies it. With 16-bit elements
// neighbouring units share words when Q > 1, so only a pass that owns whole
// words may write them; it also spreads a long unit's writes over the device.

// Element type of gradients and parameters (both the same), set by the host.
// 16-bit elements are read and written as halves of u32 words, element 2w in
// the low half, decoded and rounded on the integer bits (half.wgsl).
override DTYPE: u32 = 0u;
const AGC_DTYPE_F32: u32 = 0u;
const AGC_DTYPE_F16: u32 = 1u;
const AGC_DTYPE_BF16: u32 = 2u;

struct AgcParams {
    clipping: f32,
    eps: f32,
    tensors: u32,
    units: u32,  // units of all tensors
    words: u32,  // u32 words of the gradients the tensors cover
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// Per tensor, 5 words: first unit, first element, P, R, Q. Sorted by first
// element (the layout's order).
struct TensorUnits {
    unit_begin: u32,
    offset: u32,
    p: u32,
    r: u32,
    q: u32,
}

// One unit's result, for agc_scale and for the host to read when it asks.
struct UnitStat {
    grad_norm: f32,
    param_norm: f32,
    max_norm: f32,
    factor: f32, // 1: kept
}

@group(0) @binding(0) var<storage, read_write> grads: array<u32>;
@group(0) @binding(1) var<storage, read> params: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read_write> unit_stats: array<UnitStat>;
@group(0) @binding(4) var<uniform> prm: AgcParams;

const WG: u32 = 64u;
var<workgroup> g_sum: array<f32, WG>;
var<workgroup> p_sum: array<f32, WG>;

fn elements_per_word() -> u32 {
    return select(2u, 1u, DTYPE == AGC_DTYPE_F32);
}

// Element e (even: low half) of its word, as f32.
fn decode(word: u32, e: u32) -> f32 {
    if DTYPE == AGC_DTYPE_F32 {
        return bitcast<f32>(word);
    }
    let h = select(word & 0xffffu, word >> 16u, (e & 1u) == 1u);
    if DTYPE == AGC_DTYPE_F16 {
        return bitcast<f32>(f16_to_f32_bits(h));
    }
    return bitcast<f32>(h << 16u);
}

// The bits of x in the element type (low 16 for 16-bit), rounded to nearest even.
fn encode(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if DTYPE == AGC_DTYPE_F32 {
        return bits;
    }
    if DTYPE == AGC_DTYPE_F16 {
        return f32_bits_to_f16(bits);
    }
    return f32_bits_to_bf16(bits);
}

fn grad(e: u32) -> f32 {
    return decode(grads[e / elements_per_word()], e);
}

fn param(e: u32) -> f32 {
    return decode(params[e / elements_per_word()], e);
}

fn tensor_at(t: u32) -> TensorUnits {
    let i = 5u * t;
    return TensorUnits(table[i], table[i + 1u], table[i + 2u], table[i + 3u], table[i + 4u]);
}

// The last tensor whose `column` (0: first unit, 1: first element) is <= x.
fn last_at_or_below(column: u32, x: u32) -> u32 {
    var lo = 0u;
    var hi = prm.tensors;
    while hi - lo > 1u {
        let mid = (lo + hi) / 2u;
        if table[5u * mid + column] <= x {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & ABS_MASK) > EXP_MASK;
}

// jnp.maximum: NaN if either is NaN (WGSL's max leaves that open).
fn maximum(a: f32, b: f32) -> f32 {
    if is_nan(a) || is_nan(b) {
        return f32_from_bits(QUIET_NAN);
    }
    return max(a, b);
}

// agc_norms — reads: grads and params of each unit, the unit table. Writes:
// the unit's UnitStat (norms, threshold, factor); the gradients are not touched.
// Dispatch: (min(units, L), 1, 1), L the device's per-dimension limit;
// workgroups stride over the units.
@compute @workgroup_size(64)
fn agc_norms(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    for (var u = wg.x; u < prm.units; u += nwg.x) {
        let t = tensor_at(last_at_or_below(0u, u));
        let local = u - t.unit_begin;
        let base = t.offset + (local / t.q) * t.r * t.q + local % t.q;
        var gs = 0.0;
        var ps = 0.0;
        for (var r = lid; r < t.r; r += WG) {
            let e = base + r * t.q;
            let g = grad(e);
            let w = param(e);
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
            factor = rounded_divide(max_norm, maximum(g_norm, 1e-6));
        }
        if lid == 0u {
            unit_stats[u] = UnitStat(g_norm, p_norm, max_norm, factor);
        }
        // Everyone has read the sums before the next unit overwrites them.
        workgroupBarrier();
    }
}

// agc_scale — reads: the unit table, every unit's factor (agc_norms), the
// gradient words holding a clipped unit's element. Writes: those words, their
// clipped elements multiplied by their unit's factor and rounded to the
// element type; padding halves and kept units' elements are left as they are.
// Dispatch: (min(ceil(words / 64), L), 1, 1), L the device's per-dimension
// limit; invocations stride over the words.
@compute @workgroup_size(64)
fn agc_scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let per_word = elements_per_word();
    for (var w = gid.x; w < prm.words; w += nwg.x * WG) {
        // Tensors start on word boundaries, so one word is in one tensor (or
        // in none: the padding after an odd 16-bit tensor).
        let t = tensor_at(last_at_or_below(1u, w * per_word));
        // The factors of the word's elements first: a word of kept units is
        // not even read.
        var factors = vec2(1.0, 1.0);
        var scaled = false;
        for (var k = 0u; k < per_word; k++) {
            let e = w * per_word + k;
            let local = e - t.offset;
            if e < t.offset || local / t.q >= t.p * t.r {
                continue;
            }
            let unit = t.unit_begin + (local / (t.r * t.q)) * t.q + local % t.q;
            factors[k] = unit_stats[unit].factor;
            scaled = scaled || bitcast<u32>(factors[k]) != ONE_BITS;
        }
        if !scaled {
            continue;
        }
        let word = grads[w];
        var out = word;
        for (var k = 0u; k < per_word; k++) {
            if bitcast<u32>(factors[k]) == ONE_BITS {
                continue;
            }
            let e = w * per_word + k;
            let scaled_bits = encode(decode(word, e) * factors[k]);
            if DTYPE == AGC_DTYPE_F32 {
                out = scaled_bits;
            } else {
                let shift = 16u * k;
                out = (out & ~(0xffffu << shift)) | (scaled_bits << shift);
            }
        }
        grads[w] = out;
    }
}
