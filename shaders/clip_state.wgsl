// The clip result gradclip leaves at offset 0 of a set's stats buffer
// (GradSet::coefficient_binding), and how to apply it exactly. Every gradclip
// module starts with this file, and the crate exports it verbatim
// (gradclip::wgsl::CLIP_STATE) for optimizer and loss shaders that bind the
// record: declare `@group(G) @binding(B) var<storage, read> clip: ClipState;`
// after pasting it, and multiply gradients with clip_apply(g, clip).
//
// Bit tests use the integer bits: WGSL lets compilers assume finite math and
// flush subnormals, and some drivers (SwiftShader) do.

struct ClipState {
    total_norm: f32,     // of g / S when unscaling; +inf above f32::MAX (the factor stays exact)
    coefficient: f32,    // the factor as an f32 (0 or subnormal when it is below the normal range)
    nonfinite: u32,      // 1: an element was inf, 2: NaN, 4: a supplied partial was invalid
    scale_kind: u32,     // CLIP_SCALE_*: how the scale pass treats each element
    dispatch: array<u32, 3>,  // gradclip's own scale dispatch
    found_inf: u32,      // 1: an unscaling clip saw a NaN/inf; gradients untouched, skip the step
    loss_scale: f32,     // the loss scale S for the next backward pass
    unscaled_by: f32,    // the S this clip divided by (1 when it did not unscale)
    growth_tracker: u32, // GradScaler's count of successive finite steps
    step: u32,           // low 32 bits of the step that wrote this record
    coef_mant: f32,      // the factor exactly: coef_mant * 2^coef_exp, coef_mant in [1, 2), 0 or NaN
    coef_exp: i32,
    flags: u32,          // gradclip's CFG_* bits of that step
    max_norm: f32,       // the threshold it clipped to (an adaptive clip's, set on the GPU)
}

// ClipState.scale_kind, which gradclip's scale pass and clip_apply both go by.
const CLIP_SCALE_MULTIPLY: u32 = 0u;    // g * the exact factor coef_mant * 2^coef_exp
const CLIP_SCALE_ZERO_FINITE: u32 = 1u; // PyTorch with an inf norm: finite -> signed 0, inf/NaN -> NaN
const CLIP_SCALE_ALL_NAN: u32 = 2u;     // NaN norm (or TensorFlow with any non-finite norm)
const CLIP_SCALE_PER_TENSOR: u32 = 3u;  // each tensor by its own factor (gradclip's own scale pass)

// sign | r * 2^k for r in [1, 4): exact where the result is a normal f32,
// rounded to nearest even (on the bits) where it is subnormal, +-inf above.
fn clip_compose(sign: u32, r: f32, k: i32) -> f32 {
    let rb = bitcast<u32>(r);
    let n = i32(rb >> 23u) + k;
    if n >= 255 {
        return bitcast<f32>(sign | 0x7f800000u);
    }
    if n >= 1 {
        return bitcast<f32>(sign | (u32(n) << 23u) | (rb & 0x007fffffu));
    }
    let shift = u32(1 - n);
    if shift > 24u {
        return bitcast<f32>(sign);
    }
    let mant = (rb & 0x007fffffu) | 0x00800000u;
    var q = mant >> shift;
    let rest = mant & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    if rest > half || (rest == half && (q & 1u) == 1u) {
        q += 1u; // a carry into 0x00800000 is the smallest normal, as it should be
    }
    return bitcast<f32>(sign | q);
}

// The factor m * 2^e as an f32 when that is a normal number, else 0: the
// factor the fast path multiplies by (0 sends every element to the exact path).
fn clip_fast_factor(m: f32, e: i32) -> f32 {
    let mb = bitcast<u32>(m);
    if mb < 0x3f800000u || mb >= 0x40000000u {
        return 0.0; // m is 0 or NaN
    }
    let f = clip_compose(0u, m, e);
    let exponent = bitcast<u32>(f) & 0x7f800000u;
    return select(0.0, f, exponent != 0u && exponent != 0x7f800000u);
}

// g * (m * 2^e), rounded once, whatever the magnitudes: `fast` is
// clip_fast_factor(m, e). The plain product is used when it is a normal
// number; otherwise g and the factor are multiplied as mantissas and the
// exponents added on the bits, so that neither a subnormal g, a factor below
// f32::MIN_POSITIVE, nor a subnormal result is flushed to zero (subnormal
// results are within one subnormal ulp). NaN and inf follow IEEE.
fn clip_mul_exact(g: f32, fast: f32, m: f32, e: i32) -> f32 {
    let r = g * fast;
    let exponent = bitcast<u32>(r) & 0x7f800000u;
    if exponent != 0u && exponent != 0x7f800000u {
        return r;
    }
    let gb = bitcast<u32>(g);
    let a = gb & 0x7fffffffu;
    let mb = bitcast<u32>(m);
    if a >= 0x7f800000u || (mb & 0x7f800000u) == 0x7f800000u {
        return g * m; // inf or NaN in: IEEE's answer
    }
    let sign = gb & 0x80000000u;
    if a == 0u || (mb & 0x7fffffffu) == 0u {
        return bitcast<f32>(sign ^ (mb & 0x80000000u));
    }
    let biased = a >> 23u;
    var gm: f32;
    var ge: i32;
    if biased != 0u {
        gm = bitcast<f32>(0x3f800000u | (a & 0x007fffffu));
        ge = i32(biased) - 127;
    } else {
        let s = countLeadingZeros(a) - 8u;
        gm = bitcast<f32>(0x3f800000u | ((a << s) & 0x007fffffu));
        ge = -126 - i32(s);
    }
    return clip_compose(sign, gm * m, ge + e);
}

// What gradclip's scale pass writes for g under a global clip: g times the
// exact factor (CLIP_SCALE_MULTIPLY); for an inf norm under PyTorch
// semantics finite g become signed zeros and inf/NaN become NaN
// (CLIP_SCALE_ZERO_FINITE); NaN (CLIP_SCALE_ALL_NAN). For a step to skip
// (found_inf, or error_if_nonfinite with nonfinite != 0) the factor is 1, so
// this returns g unchanged. Per-tensor clips (CLIP_SCALE_PER_TENSOR) have no
// single factor and were applied by gradclip's own scale pass: g unchanged.
fn clip_apply(g: f32, s: ClipState) -> f32 {
    if s.scale_kind == CLIP_SCALE_PER_TENSOR {
        return g;
    }
    if s.scale_kind == CLIP_SCALE_MULTIPLY {
        return clip_mul_exact(g, clip_fast_factor(s.coef_mant, s.coef_exp), s.coef_mant, s.coef_exp);
    }
    let bits = bitcast<u32>(g);
    if s.scale_kind == CLIP_SCALE_ZERO_FINITE && (bits & 0x7f800000u) != 0x7f800000u {
        return bitcast<f32>(bits & 0x80000000u);
    }
    return bitcast<f32>(0x7fc00000u | (bits & 0x80000000u));
}
