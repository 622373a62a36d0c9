//! The CPU baseline: a plain single-threaded Rust loop with PyTorch's
//! semantics (norm of the per-tensor norms, coefficient
//! `min(1, max_norm / (norm + 1e-6))`), scaling only when it is below 1.

use crate::NormKind;

/// Sum of squares with 8 independent f32 accumulators, so that the compiler
/// can keep them in one vector register (a single accumulator is a serial
/// dependency chain and would make the baseline slower than it needs to be).
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..8 {
            acc[k] += c[k] * c[k];
        }
    }
    let tail: f32 = tail.iter().map(|v| v * v).sum();
    acc.iter().sum::<f32>() + tail
}

/// Sum of |x|^3, in the same 8 lanes.
fn sum_powers(x: &[f32], power: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..8 {
            acc[k] += power(c[k].abs());
        }
    }
    let tail: f32 = tail.iter().map(|v| power(v.abs())).sum();
    acc.iter().sum::<f32>() + tail
}

fn max_abs(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..8 {
            acc[k] = acc[k].max(c[k].abs());
        }
    }
    tail.iter()
        .chain(acc.iter())
        .fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Clips `grads` (tensors at `ranges`) in place; returns (norm, coefficient).
pub fn clip(
    grads: &mut [f32],
    ranges: &[std::ops::Range<usize>],
    norm: NormKind,
    max_norm: f32,
) -> (f32, f32) {
    let total = match norm {
        NormKind::L2 => ranges
            .iter()
            .map(|r| sum_squares(&grads[r.clone()]))
            .sum::<f32>()
            .sqrt(),
        NormKind::Inf => ranges
            .iter()
            .map(|r| max_abs(&grads[r.clone()]))
            .fold(0.0f32, f32::max),
        NormKind::P3 => ranges
            .iter()
            .map(|r| sum_powers(&grads[r.clone()], |a| a * a * a))
            .sum::<f32>()
            .cbrt(),
        NormKind::P1_5 => ranges
            .iter()
            .map(|r| sum_powers(&grads[r.clone()], |a| a * a.sqrt()))
            .sum::<f32>()
            .powf(1.0 / 1.5),
        NormKind::P4_5 => ranges
            .iter()
            .map(|r| sum_powers(&grads[r.clone()], |a| (a * a) * (a * a) * a.sqrt()))
            .sum::<f32>()
            .powf(1.0 / 4.5),
    };
    let coef = (max_norm / (total + 1e-6)).min(1.0);
    if coef < 1.0 {
        for g in grads.iter_mut() {
            *g *= coef;
        }
    }
    (total, coef)
}
