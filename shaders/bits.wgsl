// The f32 bit patterns every pass tests on the integer bits (the reduce,
// finalize and scale passes, the 16-bit codecs, the adaptive passes, AGC),
// in a file of its own so that modules without the clip's bindings (the
// adaptive ones) can include them.

const ABS_MASK: u32 = 0x7fffffffu;
const EXP_MASK: u32 = 0x7f800000u;
const MANT_MASK: u32 = 0x007fffffu;
const SIGN_MASK: u32 = 0x80000000u;
const QUIET_NAN: u32 = 0x7fc00000u;
const POS_INF: u32 = 0x7f800000u;
const ONE_BITS: u32 = 0x3f800000u;
const MIN_NORMAL_BITS: u32 = 0x00800000u; // f32::MIN_POSITIVE

// A quiet NaN as a runtime value. A constant expression that evaluates to NaN
// or an infinity is a shader-creation error in WGSL: Tint (Chromium, Dawn)
// rejects `bitcast<f32>(QUIET_NAN)` where naga accepts it. A function
// parameter is never a constant expression, so the bits pass through one.
fn f32_from_bits(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}

fn is_finite_f32(x: f32) -> bool {
    return (bitcast<u32>(x) & EXP_MASK) != EXP_MASK;
}
