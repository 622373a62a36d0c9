//! Per-tensor norms of tensors split across ranks, from the norms of their
//! pieces.

use gradclip::Norm;

/// The norm of a tensor from its pieces' norms: `(Σ nᵢᵖ)^(1/p)` taken
/// relative to the largest piece so nothing overflows (the max for Inf).
/// NaN if a piece is NaN, inf if a piece is inf. Every piece norm is an f32,
/// so this is exact up to the f32 rounding of each piece's norm and of the
/// result (float64 in between).
pub(crate) fn combine_piece_norms(norms: impl IntoIterator<Item = f64>, norm: Norm) -> f64 {
    let norms: Vec<f64> = norms.into_iter().collect();
    if norms.iter().any(|n| n.is_nan()) {
        return f64::NAN;
    }
    let top = norms.iter().fold(0.0f64, |m, n| m.max(n.abs()));
    let p = crate::wire::norm_p(norm) as f64;
    if top == 0.0 || top.is_infinite() || p.is_infinite() {
        return top;
    }
    let sum: f64 = norms.iter().map(|n| (n.abs() / top).powf(p)).sum();
    top * sum.powf(1.0 / p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_combine_like_the_whole() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert!(close(combine_piece_norms([3.0, 4.0], Norm::L2), 5.0));
        assert!(close(combine_piece_norms([3.0, 4.0], Norm::L1), 7.0));
        assert_eq!(combine_piece_norms([3.0, 4.0, 0.0], Norm::Inf), 4.0);
        assert!(close(
            combine_piece_norms([1.0, 2.0], Norm::P(3.0)),
            9f64.powf(1.0 / 3.0)
        ));
        // Piece norms near f32::MAX: the sum of squares would overflow f32.
        let big = f32::MAX as f64;
        assert!(close(
            combine_piece_norms([big, big], Norm::L2),
            big * 2f64.sqrt()
        ));
        assert_eq!(combine_piece_norms([0.0, 0.0], Norm::P(3.0)), 0.0);
        assert!(combine_piece_norms([1.0, f64::NAN], Norm::L2).is_nan());
        assert_eq!(
            combine_piece_norms([1.0, f64::INFINITY], Norm::L1),
            f64::INFINITY
        );
    }
}
