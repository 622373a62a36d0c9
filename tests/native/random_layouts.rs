//! Property tests: random layouts (up to thousands of tensors, sizes 0 to
//! 70 000, magnitudes across the whole f32 range) against the float64
//! reference, for every norm order and both semantics.

use crate::common;

use common::reference::{self, assert_close, assert_identical, Order};
use common::{framework_clip, rel_diff, run_clip};
use gradclip::ClipNorm;
use proptest::prelude::*;

/// One tensor: its size and the binary exponent of its magnitude.
fn tensor() -> impl Strategy<Value = (usize, i32)> {
    let size = prop_oneof![6 => 0..64usize, 3 => 64..4096usize, 1 => 4096..70_000usize];
    (size, -140..120i32)
}

fn layout() -> impl Strategy<Value = Vec<(usize, i32)>> {
    prop_oneof![1 => prop::collection::vec(tensor(), 1..16), 3 => prop::collection::vec(tensor(), 500..2500)]
}

fn order() -> impl Strategy<Value = Order> {
    prop_oneof![
        3 => Just(Order::L2),
        1 => Just(Order::Inf),
        1 => Just(Order::P(1.0)),
        1 => (0.25f64..8.0).prop_map(|p| Order::P((p * 4.0).round() / 4.0)),
    ]
}

/// Gradients for a layout: each tensor's values are uniform in ±2^exponent,
/// with some exact zeros; deterministic in `seed`.
fn fill(tensors: &[(usize, i32)], seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    let mut out = Vec::new();
    for &(size, exponent) in tensors {
        let scale = 2f64.powi(exponent);
        for _ in 0..size {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            out.push(if x.is_multiple_of(17) {
                0.0
            } else {
                (u * scale) as f32
            });
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn gpu_matches_float64_reference(
        tensors in layout(),
        seed in any::<u64>(),
        order in order(),
        ratio in prop_oneof![Just(0.3f64), Just(3.0f64)],
        tensorflow in any::<bool>(),
    ) {
        let sizes: Vec<usize> = tensors.iter().map(|t| t.0).collect();
        let data = fill(&tensors, seed);
        let want = reference::norm(&data, order);
        // A threshold below or above the norm: clip and no-clip steps.
        let max_norm = ((want * ratio) as f32).clamp(f32::MIN_POSITIVE, f32::MAX);
        let clip = framework_clip(tensorflow, max_norm).norm(order.to_norm());
        let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();

        let want_f32 = if want > f32::MAX as f64 { f64::INFINITY } else { want };
        // A subnormal norm (a few tiny elements) has fewer significant bits
        // than the tolerance, and a flushing driver may return 0, as the
        // per-tensor norms below allow.
        let subnormal = want_f32 < f32::MIN_POSITIVE as f64
            && (report.total_norm as f64 - want_f32).abs() <= f32::MIN_POSITIVE as f64;
        prop_assert!(
            rel_diff(report.total_norm as f64, want_f32) <= 1e-5 || subnormal,
            "{} tensors, {:?}: norm {:e}, want {:e}", sizes.len(), order, report.total_norm, want
        );
        let expect = if tensorflow {
            reference::tensorflow_clipped(&data, want, max_norm as f64)
        } else {
            reference::torch_clipped(&data, want, max_norm as f64)
        };
        if report.coefficient == 1.0 {
            assert_identical(&after, &data, "coefficient 1: untouched");
        }
        assert_close(&after, &expect, 1e-5, &format!("{order:?} clipped"));
    }
}

/// Layouts whose flat chunks hold up to a few hundred segments: on most
/// drivers reduce_tensors then folds each segment during the flat walk
/// (reduce.wgsl, tracks_segments), with segment boundaries at every place
/// in a team's piece, in its steps and in a quad. Sizes mostly a few
/// hundred to a few thousand elements; magnitudes from 2^-100 (sums of
/// squares below the fast path's window) to 2^120 (squares and powers that
/// overflow), so that every tensor's norm is a normal float. Mostly no
/// tensor shorter than a block of the walk (16 elements on CPU adapters),
/// down to one or two blocks, so that chunks are tracked in rounds of one
/// step upwards (tracked_round); sometimes tensors from 0 elements, whose
/// chunks the walk leaves to the per-segment paths.
fn tracked_layout() -> impl Strategy<Value = Vec<(usize, i32)>> {
    let blocks = prop_oneof![1 => 16..48usize, 1 => 48..100usize, 4 => 100..3000usize, 1 => 3000..20_000usize];
    let any = prop_oneof![1 => 0..100usize, 4 => 100..3000usize, 1 => 3000..20_000usize];
    prop_oneof![
        3 => prop::collection::vec((blocks, -100..120i32), 40..400),
        1 => prop::collection::vec((any, -100..120i32), 40..400),
    ]
}

/// Hundreds to a couple of thousand tensors of at most a few hundred
/// elements: chunks of a few hundred segments, which CPU drivers track in
/// the flat walk (each invocation its own piece: up to 1505 segments in a
/// chunk) and GPUs do not (up to 161); or up to 3000 tensors of at most 20
/// elements, whose chunk of more segments than that no driver tracks.
fn small_tensors_layout() -> impl Strategy<Value = Vec<(usize, i32)>> {
    let small = prop_oneof![3 => 0..64usize, 1 => 64..400usize];
    prop_oneof![
        prop::collection::vec((small, -100..120i32), 200..2000),
        prop::collection::vec((0..20usize, -100..120i32), 1400..3000),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn tensor_norms_match_float64_and_leave_the_global_norm_alone(
        tensors in prop_oneof![2 => tracked_layout(), 1 => small_tensors_layout()],
        seed in any::<u64>(),
        // L2, Inf, integer p and a general p, each tracked in the flat
        // walk (a general p's terms relative to a reference that follows
        // the lane's running maximum, and rescaled with it).
        order in prop_oneof![2 => Just(Order::L2), 2 => Just(Order::Inf), 1 => Just(Order::P(1.0)), 1 => Just(Order::P(3.0)), 1 => Just(Order::P(8.0)), 1 => Just(Order::P(1.5))],
        zeros in 0..12usize,
    ) {
        // An L1 norm of 20 000 elements near 2^120 is past f32::MAX: a p
        // norm's tensors stay at or below 2^100 (their powers still
        // overflow from 2^43 for p = 3 and 2^16 for p = 8).
        let tensors: Vec<(usize, i32)> = match order {
            Order::P(_) => tensors.iter().map(|&(n, e)| (n, e.min(100))).collect(),
            _ => tensors,
        };
        let sizes: Vec<usize> = tensors.iter().map(|t| t.0).collect();
        let mut data = fill(&tensors, seed);
        // Some all-zero tensors: their plain sums are zero, which the
        // fast paths hand on to the exact ones.
        let mut at = 0;
        for (t, &n) in sizes.iter().enumerate() {
            if zeros > 0 && t % (zeros + 5) == 0 {
                data[at..at + n].fill(0.0);
            }
            at += n;
        }
        let clip = ClipNorm::new(1.0).norm(order.to_norm());
        let (plain, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let (logged, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip.tensor_norms(true)));
        let (again, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip.tensor_norms(true)));
        let (plain, logged, again) = (plain.unwrap(), logged.unwrap(), again.unwrap());
        prop_assert_eq!(plain.total_norm.to_bits(), logged.total_norm.to_bits(), "tensor_norms moved the global norm");
        prop_assert_eq!(plain.partial.to_bytes(), logged.partial.to_bytes());
        let bits = |r: &gradclip::ClipReport| r.tensor_norms.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&logged), bits(&again), "per-tensor norms differ between two runs");
        reference::assert_tensor_norms(&logged.tensor_norms, &data, &sizes, order, 1e-5, &format!("{} tensors {order:?}", sizes.len()));
    }
}

/// Layouts of many small tensors, most of one to a few dozen elements,
/// magnitudes 2^-125 to 2^100 (some all-zero, some with elements below
/// 2^-63 or at or beyond 2^44, which Blue's small and big bins take):
/// tensor_stats takes most of them on its straight-line path and queues
/// the rest for the general one.
fn small_tensor_layout() -> impl Strategy<Value = Vec<(usize, i32)>> {
    let size = prop_oneof![6 => 1..4usize, 3 => 4..64usize, 1 => 64..3000usize];
    prop::collection::vec((size, -125..100i32), 100..3000)
}

/// What PyTorch (`max_norm / (norm + 1e-6)`, at most 1) and TensorFlow
/// (`clip_norm / norm` above `clip_norm`) compute in f32 from a norm.
fn framework_factor(norm: f32, max_norm: f32, tensorflow: bool) -> f32 {
    if tensorflow {
        if norm <= max_norm {
            1.0
        } else {
            max_norm / norm
        }
    } else {
        (max_norm / (norm + 1e-6)).min(1.0)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn tensor_factors_are_the_frameworks_f32_arithmetic(
        tensors in small_tensor_layout(),
        seed in any::<u64>(),
        inf in any::<bool>(),
        tensorflow in any::<bool>(),
        max_exponent in -30..30i32,
    ) {
        let sizes: Vec<usize> = tensors.iter().map(|t| t.0).collect();
        let data = fill(&tensors, seed);
        let (order, norm) = if inf { (Order::Inf, gradclip::Norm::Inf) } else { (Order::L2, gradclip::Norm::L2) };
        let max_norm = 2f32.powi(max_exponent) * 1.37;
        let clip = framework_clip(tensorflow, max_norm).norm(norm).tensor_norms(true);
        let (report, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();
        prop_assert_eq!(report.tensor_coefficients.len(), sizes.len());
        let mut start = 0;
        for (t, (&n, &c)) in report.tensor_norms.iter().zip(&report.tensor_coefficients).enumerate() {
            let want_norm = reference::norm(&data[start..start + sizes[t]], order);
            start += sizes[t];
            // A subnormal norm (a tensor of one tiny element) may be flushed.
            let close = rel_diff(n as f64, want_norm) <= 1e-5
                || (want_norm < f32::MIN_POSITIVE as f64 && (n as f64 - want_norm).abs() <= f32::MIN_POSITIVE as f64);
            prop_assert!(close, "tensor {} of {}: norm {:e}, want {:e}", t, sizes.len(), n, want_norm);
            let want = framework_factor(n, max_norm, tensorflow);
            // A subnormal factor is kept exactly as m * 2^e, which its f32
            // form rounds once more.
            if want >= f32::MIN_POSITIVE {
                prop_assert_eq!(c.to_bits(), want.to_bits(), "tensor {} of {}: norm {:e}, factor {:e}, want {:e}", t, sizes.len(), n, c, want);
            }
        }
    }

    #[test]
    fn a_lone_tensors_results_are_the_global_ones(
        size in 1..30_000usize,
        exponent in prop_oneof![3 => -60..40i32, 1 => -140..120i32],
        seed in any::<u64>(),
        order in order(),
        tensorflow in any::<bool>(),
        unscale in prop::bool::weighted(0.25),
        ratio in prop_oneof![Just(0.3f64), Just(3.0f64)],
    ) {
        // One tensor in one chunk: its segment's partial is the chunk's, so
        // tensor_stats and finalize turn the same partial into a norm and a
        // factor, on their own paths.
        let data = fill(&[(size, exponent)], seed);
        let want = reference::norm(&data, order);
        let max_norm = ((want * ratio) as f32).clamp(f32::MIN_POSITIVE, f32::MAX);
        let clip = framework_clip(tensorflow, max_norm).norm(order.to_norm()).tensor_norms(true).unscale(unscale);
        let (report, _) = run_clip(&data, &[size], |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();
        prop_assert_eq!(report.tensor_norms[0].to_bits(), report.total_norm.to_bits(), "{:?}: norm", order);
        prop_assert_eq!(report.tensor_coefficients[0].to_bits(), report.coefficient.to_bits(), "{:?}: factor", order);
    }
}
