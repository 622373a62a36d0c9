// A norm's clip factor, from a Partial: the arithmetic that finalize applies
// to the total and that per-tensor results apply to each tensor, in the
// reduce pass (a tensor that is one segment) or in tensor_stats (the
// others). One copy of it, so both give a tensor the same bits.

// A norm as an f32 (inf if it overflows) and exactly as y * 2^k, y in [1, 2)
// (y = 0 for a zero norm).
struct NormValue {
    norm: f32,
    y: f32,
    k: i32,
}

// A positive finite y * 2^k, normalised so that y is in [1, 2).
fn normalised(y: f32, k: i32) -> NormValue {
    if y == 0.0 {
        return NormValue(0.0, 0.0, 0);
    }
    let d = decode(bitcast<u32>(y));
    // On the bits, so that a subnormal norm survives drivers that flush
    // (SwiftShader's ldexp returned 0 for a norm of 7.5e-39).
    return NormValue(clip_compose(0u, d.m, d.e + k), d.m, d.e + k);
}

// Exponents beyond this are clamped: the value is then far outside f32 (and
// f64) either way, and i32 arithmetic on them stays exact. Tiny p makes
// log2(norm) huge (p = 1e-10 over two equal elements gives 2^(10^10)).
const EXP_CLAMP: f32 = 4096.0;

fn norm_value(q: Partial, kind: u32) -> NormValue {
    switch kind {
        case 0u: {
            let small = q.v.x;
            let medium = q.v.y;
            let big = q.v.z;
            // Bring the bins to the scale of the largest non-empty one (the
            // squares carry twice the element scale); what falls below the
            // normal range there is negligible against the bin it joins.
            if big > 0.0 {
                return normalised(sqrt(big + mul_pow2(medium, -168)), 84);
            }
            if medium >= 0x1p-50f || small == 0.0 {
                return normalised(sqrt(medium + mul_pow2(small, -172)), 0);
            }
            return normalised(sqrt(small + mul_pow2(medium, 172)), -86);
        }
        case 1u: {
            // Exact: the bits of the largest |g|, subnormal or not.
            let a = bitcast<u32>(q.v.x);
            if a == 0u {
                return NormValue(0.0, 0.0, 0);
            }
            let d = decode(a);
            return NormValue(q.v.x, d.m, d.e);
        }
        default: {
            let s = q.v.x;
            if s == 0.0 {
                return NormValue(0.0, 0.0, 0);
            }
            if s == 1.0 {
                // m * 2^E exactly, where the log2 and exp2 below would round
                // (a one-element tensor's partial, plain_clip's case).
                return normalised(q.v.y, i32(q.v.z));
            }
            // norm = m * 2^E * s^(1/p); log2 taken on s's mantissa in [0.5, 1),
            // where log2 is accurate to 2^-21 absolute.
            let parts = frexp(s);
            let l = clamp(log2(q.v.y) + (f32(parts.exp) + log2(parts.fract)) / cfg.p, -EXP_CLAMP, EXP_CLAMP);
            let whole = floor(l);
            return normalised(exp2(l - whole), i32(q.v.z) + i32(whole));
        }
    }
}

// PyTorch's clip_grad_norm_ divides max_norm by norm + eps.
const TORCH_EPS: f32 = 1e-6;

// A clip factor, exactly: m * 2^e with m in [1, 2), or m = 0, or m NaN.
struct Factor {
    m: f32,
    e: i32,
}

fn factor_one() -> Factor {
    return Factor(1.0, 0);
}

// num / (dm * 2^de) for num >= 0 finite (subnormal included) and dm in [1, 2):
// one rounding of the mantissa quotient, whatever the exponents.
fn divide(num: f32, dm: f32, de: i32) -> Factor {
    let a = bitcast<u32>(num) & ABS_MASK;
    if a == 0u {
        return Factor(0.0, 0);
    }
    let n = decode(a);
    return quotient(n.m, n.e, dm, de);
}

// (nm * 2^ne) / (dm * 2^de) for mantissas in [1, 2): one rounding of the
// mantissa quotient, as f32 division rounds, brought back into [1, 2).
fn quotient(nm: f32, ne: i32, dm: f32, de: i32) -> Factor {
    let q = mantissa_quotient(nm, dm);
    return Factor(q.m, ne - de - i32(q.below));
}

fn factor_f32(f: Factor) -> f32 {
    let b = bitcast<u32>(f.m);
    if (b & ABS_MASK) == 0u || (b & EXP_MASK) == EXP_MASK {
        return f.m;
    }
    return clip_compose(0u, f.m, f.e);
}

fn is_one(f: Factor) -> bool {
    return bitcast<u32>(f.m) == ONE_BITS && f.e == 0;
}

// A norm's clip factor under cfg's semantics, with the element flags that
// make it NaN or zero.
struct Coefficient {
    norm: f32,
    factor: Factor,
    scale_kind: u32,
}

fn coefficient(nv: NormValue, flags: u32) -> Coefficient {
    if flags != 0u {
        // PyTorch: max_norm / (inf + eps) = 0, and NaN spreads. TensorFlow:
        // any non-finite norm makes every gradient NaN.
        let nan = (flags & FLAG_NAN) != 0u;
        let norm = f32_from_bits(select(POS_INF, QUIET_NAN, nan));
        if cfg.semantics == SEMANTICS_TORCH && !nan {
            return Coefficient(norm, Factor(0.0, 0), CLIP_SCALE_ZERO_FINITE);
        }
        return Coefficient(norm, Factor(f32_from_bits(QUIET_NAN), 0), CLIP_SCALE_ALL_NAN);
    }
    var f: Factor;
    if cfg.semantics == SEMANTICS_TORCH {
        if is_finite_f32(nv.norm) {
            // PyTorch's f32 arithmetic: max_norm / (norm + eps), min 1.
            let d = decode(bitcast<u32>(nv.norm + TORCH_EPS));
            f = divide(cfg.max_norm, d.m, d.e);
        } else {
            // The norm overflows f32; its exact form still gives the ratio.
            f = divide(cfg.max_norm, nv.y, nv.k);
        }
        if f.m != 0.0 && f.e >= 0 {
            // min(coefficient, 1); a zero max_norm keeps its zero factor.
            f = factor_one();
        }
    } else if is_finite_f32(nv.norm) && nv.norm <= cfg.max_norm {
        f = factor_one();
    } else {
        f = divide(cfg.max_norm, nv.y, nv.k);
    }
    return Coefficient(nv.norm, f, CLIP_SCALE_MULTIPLY);
}

// Whether S can divide: finite, positive and normal. GradScaler's backoff
// can drive a scale to zero after ~150 overflowing steps in a row; PyTorch
// then unscales by inf and finds every step non-finite, as this does.
fn usable_scale(s: f32) -> bool {
    return positive_normal(s);
}

// Whether x is finite, positive and normal, from its bits: a compare
// would take a flushing driver's subnormal for zero.
fn positive_normal(x: f32) -> bool {
    let b = bitcast<u32>(x);
    return b >= MIN_NORMAL_BITS && b < EXP_MASK;
}

// The norm (of g / S when `unscaling`) and the factor that the stored
// gradients are multiplied by: the clip factor, divided by S when unscaling,
// so that one multiply unscales and clips. `s` is usable when `unscaling`
// and no element is non-finite.
fn clip_of(q: Partial, kind: u32, unscaling: bool, s: f32) -> Coefficient {
    let nv = norm_value(q, kind);
    if !unscaling || q.flags != 0u {
        return coefficient(nv, q.flags);
    }
    let d = decode(bitcast<u32>(s));
    // The norm of g / S = y * 2^k / (m_S * 2^e_S): one division by m_S (none
    // for the powers of two GradScaler keeps) and exponent arithmetic.
    var unscaled = NormValue(0.0, 0.0, 0);
    if nv.y != 0.0 {
        let q = quotient(nv.y, nv.k, d.m, d.e);
        unscaled = normalised(q.m, q.e);
    }
    let c = coefficient(unscaled, 0u);
    return Coefficient(c.norm, divide(c.factor.m, d.m, d.e - c.factor.e), c.scale_kind);
}

// A tensor's norm and factor where it is plain: clip_of's result, by the
// same arithmetic, for an L2 partial with no element in the big bin and
// the medium one carrying the norm (or the small one empty), an Inf
// partial whose largest element is normal or zero, or a p partial of s = 0
// or s = 1 with m * 2^E normal; no non-finite element,
// no unscaling, a normal max_norm. Code with few and short branches: CPU drivers (Mesa
// 22's lavapipe and llvmpipe, SwiftShader) run every branch's body under a
// lane mask whether or not a lane takes it, uniform conditions included,
// so clip_of costs all of its paths for each tensor there, while a loop
// that no lane enters costs one masked pass of its body. (200 000
// one-element tensors on lavapipe: tensor_stats and finalize 2.8 ms with
// clip_of for every tensor, 2.9 with this path in front of it under an
// if, 1.5 with the queue below.)
struct PlainClip {
    c: Coefficient,
    ok: bool,
}

fn plain_clip(q: Partial, unscaling: bool) -> PlainClip {
    var ok = q.flags == 0u && plain_clip_usable(unscaling);
    var norm: f32;
    if KIND == 0u {
        // norm_value's middle case; its result is 0 or a normal float, so
        // normalised() gives it back unchanged.
        ok = ok && q.v.z == 0.0 && (q.v.y >= 0x1p-50f || q.v.x == 0.0);
        norm = sqrt(q.v.y + mul_pow2(q.v.x, -172));
    } else if KIND == 2u {
        // norm_value's exact cases: s = 0, and s = 1 (every one-element
        // tensor's partial for general p) where m * 2^E is normal.
        let e = i32(q.v.z);
        ok = ok && (q.v.x == 0.0 || (q.v.x == 1.0 && e >= -126 && e <= 127));
        norm = select(mul_pow2(q.v.y, e), 0.0, q.v.x == 0.0);
    } else {
        return plain_norm_clip(q.v.x, ok);
    }
    return PlainClip(Coefficient(norm, plain_factor(norm), CLIP_SCALE_MULTIPLY), ok);
}

// plain_clip for tensor_stats, whose tensors mostly have several
// elements: a p partial of any s too, by norm_value's root (a log2 and an
// exp2, as clip_of takes it), where that gives 0 or a normal norm. plain_clip
// takes only s = 0 and s = 1, to spare the reduce pass's one-element and
// tiny tensors the root; here, with it, an integer p's tensors no longer
// all go to clip_of (p = 3, 10 000 tensors: tensor_stats 2.6-2.8 ms ->
// 1.5-1.6 on SwiftShader, 0.8-0.9 -> 0.5-0.6 on lavapipe and llvmpipe).
fn tensor_clip(q: Partial, unscaling: bool) -> PlainClip {
    if KIND != 2u {
        return plain_clip(q, unscaling);
    }
    return plain_norm_clip(norm_value(q, 2u).norm, q.flags == 0u && plain_clip_usable(unscaling));
}

// The plain clip of a norm already found, `ok` holding the caller's other
// conditions: taken where the norm is zero or a positive normal float, by
// its bits (a flushing driver's compare takes a subnormal for zero).
// plain_clip's Inf case (the largest element's bits), tensor_clip's root,
// and the reduce pass's one-element tensors of a p (their element's bits).
fn plain_norm_clip(norm: f32, ok: bool) -> PlainClip {
    let plain = bitcast<u32>(norm) == 0u || positive_normal(norm);
    return PlainClip(Coefficient(norm, plain_factor(norm), CLIP_SCALE_MULTIPLY), ok && plain);
}

// A test for plain_factor being 1 without its division: for PyTorch, the
// divisor norm + eps below 2^E (`below`'s bits), E max_norm's exponent,
// since the quotient's exponent is then f.e >= E - (E - 1) - 1 = 0
// whatever the division's rounding; for TensorFlow, norm <= max_norm
// (norm's bits below `below`). Nothing passes (`below` 0) where
// plain_clip takes no tensor. The reduce pass's one-element tensors,
// whose factor is nearly always 1, take it instead of plain_factor's
// division and dozen operations for every tensor.
struct FactorOne {
    torch: bool,
    below: u32,
}

fn factor_one_test(unscaling: bool) -> FactorOne {
    let n = bitcast<u32>(cfg.max_norm);
    let torch = cfg.semantics == SEMANTICS_TORCH;
    let below = select(n + 1u, n & EXP_MASK, torch);
    return FactorOne(torch, select(0u, below, plain_clip_usable(unscaling)));
}

// Whether each of four norms (zero or positive normal) has plain_factor 1
// by test f.
fn factor_is_one(norm: vec4<f32>, f: FactorOne) -> vec4<bool> {
    let key = select(norm, norm + vec4(TORCH_EPS), f.torch);
    return bitcast<vec4<u32>>(key) < vec4(f.below);
}

// Whether plain_clip can take any tensor of this clip: no unscaling, a
// normal max_norm.
fn plain_clip_usable(unscaling: bool) -> bool {
    return !unscaling && positive_normal(cfg.max_norm);
}

// coefficient's factor for a finite norm and no flags, where
// plain_clip_usable: PyTorch's max_norm / (norm + 1e-6), at most 1;
// TensorFlow's max_norm / norm above max_norm. divide()'s quotient, of
// operands read straight from their bits: max_norm is normal, and so is
// the divisor wherever the factor is not 1 (norm + 1e-6 >= 1e-6; a
// TensorFlow norm above max_norm).
fn plain_factor(norm: f32) -> Factor {
    let torch = cfg.semantics == SEMANTICS_TORCH;
    let n = bitcast<u32>(cfg.max_norm);
    let d = bitcast<u32>(select(norm, norm + TORCH_EPS, torch));
    let f = quotient(normal_mantissa(n), i32(n >> 23u) - 127, normal_mantissa(d), i32(d >> 23u) - 127);
    let one = select(norm <= cfg.max_norm, f.e >= 0, torch);
    return Factor(select(f.m, 1.0, one), select(f.e, 0, one));
}

// What a tensor's coefficient takes from the clip besides its partial:
// whether the clip unscales (plain_clip then takes no tensor), and the loss
// scale s that clip_of divides by (`unscale`: unscaling by a usable s).
// The scale is read before finalize updates it.
struct StatScale {
    unscaling: bool,
    unscale: bool,
    s: f32,
}

fn stat_scale() -> StatScale {
    let unscaling = (cfg.flags & CFG_UNSCALE) != 0u;
    let s = stats.state.loss_scale;
    return StatScale(unscaling, unscaling && usable_scale(s), s);
}

// Stores tensor i's norm and factor; returns whether the factor is not 1.
fn store_tensor_stat(i: u32, c: Coefficient) -> bool {
    set_tensor_stat(i, TensorStat(c.norm, c.factor.m, c.factor.e, 0u));
    return !is_one(c.factor);
}

// Tensor i's norm and factor from its partial q by clip_of, the general
// path; returns whether the factor is not 1.
fn store_general_stat(i: u32, q: Partial, sc: StatScale) -> bool {
    return store_tensor_stat(i, clip_of(q, KIND, sc.unscale, sc.s));
}

// Tells finalize that some tensor's factor of this clip is not 1.
fn mark_clipped(clipped: bool) {
    if clipped {
        atomicStore(&stats.tensors_clipped, cfg.step);
    }
}

