// IEEE binary16 and bfloat16 <-> binary32 on the integer bits. Decoding is exact for
// every f16 (subnormals become normal f32s); encoding rounds to nearest,
// ties to even, overflowing to +-inf. Neither relies on the GPU's own
// conversions: unpack2x16float may flush subnormals and pack2x16float's
// rounding is not specified tightly enough for a round-to-nearest-even
// guarantee.

// f32 bits of the f16 in the low 16 bits of h.
fn f16_to_f32_bits(h: u32) -> u32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0x1fu {
        return sign | EXP_MASK | (m << 13u); // inf, or NaN with its payload
    }
    if e != 0u {
        return sign | ((e + 112u) << 23u) | (m << 13u);
    }
    if m == 0u {
        return sign;
    }
    // Subnormal m * 2^-24: its leading bit p (0..9) becomes the implicit one.
    let p = 31u - countLeadingZeros(m);
    return sign | ((p + 103u) << 23u) | ((m << (23u - p)) & MANT_MASK);
}

// f16 bits (low 16) of the f32 with bits x, rounded to nearest even.
fn f32_bits_to_f16(x: u32) -> u32 {
    let sign = (x >> 16u) & 0x8000u;
    let a = x & ABS_MASK;
    if a > EXP_MASK {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu); // quiet NaN
    }
    if a >= 0x477ff000u {
        return sign | 0x7c00u; // >= 65520 (halfway above 65504, odd mantissa): inf
    }
    if a <= 0x33000000u {
        return sign; // <= 2^-25: halfway to the smallest subnormal rounds to even, 0
    }
    let e = i32(a >> 23u) - 127;
    if e >= -14 {
        // Normal: drop 13 mantissa bits; a carry into the exponent is right.
        var h = (u32(e + 15) << 10u) | ((a >> 13u) & 0x3ffu);
        let rest = a & 0x1fffu;
        if rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u) {
            h += 1u;
        }
        return sign | h;
    }
    // Subnormal result: round mant * 2^(e + 1) (a multiple of 2^-24) to an integer.
    let mant = (a & MANT_MASK) | 0x800000u;
    let s = u32(-(e + 1)); // 14 ..= 24
    var m = mant >> s;
    let rest = mant & ((1u << s) - 1u);
    let half = 1u << (s - 1u);
    if rest > half || (rest == half && (m & 1u) == 1u) {
        m += 1u; // 0x400 is the smallest normal: the encoding carries over by itself
    }
    return sign | m;
}

// bf16 bits (low 16) of the f32 with bits x, rounded to nearest even. bf16 is
// the top half of an f32: decoding is `h << 16`.
fn f32_bits_to_bf16(x: u32) -> u32 {
    if (x & ABS_MASK) > EXP_MASK {
        return (x >> 16u) | 0x40u; // quiet NaN, sign kept
    }
    // The carry out of the mantissa moves into the exponent, up to inf.
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}
