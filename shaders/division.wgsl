// Division rounded as IEEE 754 rounds it (to nearest), which WGSL's `/` is
// not held to: the spec allows 2.5 ULP, and NVIDIA's Vulkan driver on an
// H200 returned the neighbour of the rounded quotient for one tensor's clip
// factor (7.5559844e-22 for PyTorch's 7.555985e-22). The frameworks' f32
// division is IEEE's, so every factor they would compute goes through here.

// A quotient of two mantissas: m in [1, 2), halved when `below`.
struct MantissaQuotient {
    m: f32,
    below: bool,
}

// nm / dm for mantissas in [1, 2), rounded to nearest.
fn mantissa_quotient(nm: f32, dm: f32) -> MantissaQuotient {
    return corrected_quotient(nm, dm, nm / dm);
}

// nm / dm rounded to nearest, from an `estimate` of it within 64 units in
// its last place (WGSL's division is within 2.5). On the 24-bit integer
// mantissas a and b: the quotient's 24 bits are q = a * 2^s / b rounded,
// s = 24 where a < b (a quotient in (0.5, 1)) and 23 otherwise. The
// remainder a * 2^s - b * q of the estimate's q is below 2^31 in magnitude,
// so u32 arithmetic that wraps at 2^32 gives it exactly; it says how many
// units of b the estimate is off. A tie cannot occur: a * 2^(s + 1) =
// b * (2q + 1) would need 2^(s + 1) to divide b < 2^24.
fn corrected_quotient(nm: f32, dm: f32, estimate: f32) -> MantissaQuotient {
    let a = (bitcast<u32>(nm) & MANT_MASK) | MIN_NORMAL_BITS;
    let b = (bitcast<u32>(dm) & MANT_MASK) | MIN_NORMAL_BITS;
    let below = a < b;
    let s = select(23u, 24u, below);
    // Signed integers and power-of-two constants throughout: CPU drivers
    // expand unsigned conversions and run integer division lane by lane.
    // (On lavapipe an integer division here and u32 conversions made the
    // per-tensor reduce of 200 000 one-element tensors, Inf clip, take
    // 0.75 ms against 0.48-0.52 before the correction.)
    // The estimate in units of 2^-s: exact, a power-of-two scaling of a
    // value in [0.25, 4] (the clamp keeps a wild driver's result in range).
    var q = i32(clamp(estimate, 0.25, 4.0) * select(0x1p23f, 0x1p24f, below));
    let r = bitcast<i32>((a << s) - b * bitcast<u32>(q));
    let bi = bitcast<i32>(b);
    // r / b rounded to nearest: by a float division, within one of it
    // (|r / b| <= 64, and f32 holds r to 2^-24 of itself), then one exact
    // step on the integer remainder (ties excluded above).
    var steps = i32(round(f32(r) / f32(bi)));
    let left = r - steps * bi;
    steps += select(0, 1, 2 * left > bi) - select(0, 1, 2 * left < -bi);
    // The rounded q is in [2^23, 2^24): a quotient below 1 is at most
    // 1 - 1/b, more than half a unit (2^-25) below 1, so it never rounds up
    // to 1.
    q += steps;
    return MantissaQuotient(bitcast<f32>(ONE_BITS | (bitcast<u32>(q) & MANT_MASK)), below);
}

// x / y rounded to nearest where x and y are positive normal floats and so
// is their quotient (the clip factors of AdaGC and AGC); any other operands,
// and quotients outside the normal range, are left to `/`.
fn rounded_divide(x: f32, y: f32) -> f32 {
    let xb = bitcast<u32>(x);
    let yb = bitcast<u32>(y);
    // A set sign bit puts the bits above EXP_MASK too.
    if xb < MIN_NORMAL_BITS || xb >= EXP_MASK || yb < MIN_NORMAL_BITS || yb >= EXP_MASK {
        return x / y;
    }
    let q = mantissa_quotient(bitcast<f32>(ONE_BITS | (xb & MANT_MASK)), bitcast<f32>(ONE_BITS | (yb & MANT_MASK)));
    let biased = i32(xb >> 23u) - i32(yb >> 23u) - i32(q.below) + 127;
    if biased < 1 || biased > 254 {
        return x / y;
    }
    return bitcast<f32>((u32(biased) << 23u) | (bitcast<u32>(q.m) & MANT_MASK));
}
