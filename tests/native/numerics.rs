//! Numerics against the float64 reference: overflow- and underflow-safe
//! norms, subnormal inputs, norms past f32::MAX, 10^7-element accuracy, and
//! gradients split over several binding windows.

use crate::common;

use common::reference::{self, assert_close, Order};
use common::{assert_no_wgpu_errors, download, rel_diff, run_clip, upload};
use gradclip::shaders::MAX_POWER;
use gradclip::{ClipNorm, GradLayout};

/// xorshift64*: reproducible values without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn check_norms(data: &[f32], sizes: &[usize], orders: &[Order], tol: f64, what: &str) {
    for &order in orders {
        let want = reference::norm(data, order);
        let max_norm = (want / 3.0).min(f32::MAX as f64) as f32;
        let clip = ClipNorm::new(max_norm).norm(order.to_norm());
        let (report, after) = run_clip(data, sizes, |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();
        assert!(
            rel_diff(report.total_norm as f64, want) <= tol,
            "{what} {order:?}: norm {:e}, want {want:e}",
            report.total_norm
        );
        let expect = reference::torch_clipped(data, want, max_norm as f64);
        assert_close(&after, &expect, 1e-5, &format!("{what} {order:?}: clipped"));
    }
}

const ALL: [Order; 5] = [
    Order::L2,
    Order::Inf,
    Order::P(1.0),
    Order::P(3.0),
    Order::P(0.5),
];

#[test]
fn huge_magnitudes_give_the_finite_norm() {
    // |g|^2 and |g|^3 overflow f32 here; the norms themselves do not.
    let mut rng = Rng(1);
    let data: Vec<f32> = (0..5000).map(|_| rng.unit() * 1e20).collect();
    check_norms(
        &data,
        &[4000, 1000],
        &[Order::L2, Order::Inf, Order::P(1.0), Order::P(3.0)],
        1e-5,
        "1e20",
    );
    let data: Vec<f32> = (0..5000).map(|_| rng.unit() * 1e13).collect();
    check_norms(
        &data,
        &[5000],
        &[Order::P(3.0), Order::P(4.0)],
        1e-5,
        "1e13",
    );
}

#[test]
fn integer_orders_follow_float64_on_either_side_of_the_plain_window() {
    // Integer p up to shaders::MAX_POWER have reduce pipelines of their
    // own that power terms by multiplication and keep a share's plain sum
    // only inside a window; MAX_POWER + 1 takes the general path. Each data set puts
    // shares on one side of the window or the other, or both: terms that
    // overflow, terms that underflow, zeros, one huge element among small.
    let mut rng = Rng(9);
    let mut unit =
        |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|_| rng.unit() * scale).collect() };
    let ordinary = unit(70_000, 1.0);
    let huge = unit(3000, 1e25);
    let tiny = unit(3000, 1e-20);
    let mut mixed = unit(100_000, 1e-3);
    mixed[54_321] = 1e6;
    mixed[10..20_000].fill(0.0);
    // Cubes below the normal range (a flushing driver drops them) beside a
    // few normal ones, which they outweigh together.
    let mut subnormal_terms: Vec<f32> = unit(20_000, 1e-13).iter().map(|g| g + 1e-13).collect();
    for g in subnormal_terms.iter_mut().step_by(5000) {
        *g = 2e-12;
    }
    let mut halves = unit(131_072, 1.0);
    halves[65_536..].copy_from_slice(&unit(65_536, 1e-20));
    // Every integer power, for term_base's steps written out one by one.
    let orders: Vec<Order> = (1..=MAX_POWER + 1).map(|p| Order::P(p.into())).collect();
    check_norms(&ordinary, &[40_000, 30_000], &orders, 1e-5, "ordinary");
    check_norms(&huge, &[3000], &orders, 1e-5, "1e25");
    check_norms(&tiny, &[1000, 2000], &orders, 1e-5, "1e-20");
    check_norms(
        &mixed,
        &[100_000],
        &orders,
        1e-5,
        "one 1e6 among 1e-3 and zeros",
    );
    check_norms(&halves, &[131_072], &orders, 1e-5, "1 then 1e-20");
    check_norms(
        &subnormal_terms,
        &[20_000],
        &[Order::P(3.0)],
        1e-5,
        "subnormal cubes",
    );
}

#[test]
fn chunk_sums_that_are_finite_alone_but_overflow_together() {
    // Eight elements of 2^62 per 32768-element chunk: each chunk's sum of
    // squares, 2^127, is a finite f32, and two of them are not. The total
    // norm, 2^64, is finite, and so must be a fold of the chunks' partials.
    let mut data = vec![0.5f32; 4 * 32768];
    for chunk in 0..4 {
        for k in 0..8 {
            data[chunk * 32768 + 1000 * k] = if k % 2 == 0 {
                2f32.powi(62)
            } else {
                -(2f32.powi(62))
            };
        }
    }
    check_norms(
        &data,
        &[data.len()],
        &[Order::L2],
        1e-6,
        "2^62 x 8 per chunk",
    );
    check_norms(
        &data,
        &[32768, 3 * 32768],
        &[Order::L2],
        1e-6,
        "two tensors",
    );
}

#[test]
fn tiny_and_subnormal_magnitudes_are_not_lost() {
    let mut rng = Rng(2);
    let data: Vec<f32> = (0..5000).map(|_| rng.unit() * 1e-25).collect();
    check_norms(&data, &[2500, 2500], &ALL, 1e-5, "1e-25");
    // Elements whose squares are subnormal (a flushing driver's plain
    // squares drop them) beside a few whose squares are normal: together
    // they outweigh those few.
    let data: Vec<f32> = (0..20_000)
        .map(|i| {
            if i % 5000 == 0 {
                2e-19
            } else {
                (1.0 + rng.unit()) * 1e-20
            }
        })
        .collect();
    check_norms(&data, &[20_000], &ALL, 1e-5, "1e-20 beside 2e-19");
    // Subnormal elements whose norm is a normal float: a flushing device
    // would report 0.
    let data: Vec<f32> = (0..1_000_000).map(|_| rng.unit() * 1e-39).collect();
    assert!(data.iter().all(|g| *g == 0.0 || !g.is_normal()));
    let (report, _) = run_clip(&data, &[1_000_000], |set, enc| {
        set.clip_norm(enc, &ClipNorm::new(1.0))
    });
    let want = reference::norm(&data, Order::L2);
    assert!(
        rel_diff(report.unwrap().total_norm as f64, want) <= 1e-5,
        "subnormal L2, want {want:e}"
    );
}

#[test]
fn mixed_scales_in_one_vector() {
    let mut rng = Rng(3);
    let data: Vec<f32> = (0..30_000)
        .map(|i| rng.unit() * [1e-30, 1e-12, 1.0, 1e12, 3e19][i % 5])
        .collect();
    check_norms(&data, &[10_000, 0, 20_000], &ALL, 1e-5, "mixed");
}

#[test]
fn norm_past_f32_max_still_clips_exactly() {
    let data = vec![3e38f32; 100]; // L2 norm 3e39, L1 norm 3e40
    for order in [Order::L2, Order::P(1.0)] {
        let want = reference::norm(&data, order);
        let clip = ClipNorm::new(1e30)
            .norm(order.to_norm())
            .error_if_nonfinite(true);
        let (report, after) = run_clip(&data, &[100], |set, enc| set.clip_norm(enc, &clip));
        let report = report.expect("finite elements are not an error, whatever the norm");
        assert_eq!(
            report.total_norm,
            f32::INFINITY,
            "{order:?}: not representable in f32"
        );
        assert!(!report.nonfinite);
        assert!(
            rel_diff(report.coefficient as f64, 1e30 / want) <= 1e-5,
            "{order:?}: {report:?}"
        );
        assert_close(
            &after,
            &reference::torch_clipped(&data, want, 1e30),
            1e-5,
            &format!("{order:?}"),
        );
    }
}

#[test]
fn forty_million_elements_in_two_windows_within_1e5() {
    // 160 MB: past the default 128 MiB storage binding, so at least two windows.
    let mut rng = Rng(4);
    let n = 40_000_000;
    let data: Vec<f32> = (0..n)
        .map(|i| rng.unit() * if i % 1000 == 0 { 50.0 } else { 0.01 })
        .collect();
    let sizes: Vec<usize> = [12_345_678, 1, 0, 20_000_000]
        .into_iter()
        .chain([n - 32_345_679])
        .collect();
    check_norms(
        &data,
        &sizes,
        &[Order::L2, Order::Inf, Order::P(1.0), Order::P(3.0)],
        1e-5,
        "4e7",
    );
}

#[test]
fn small_binding_limit_splits_into_many_windows() {
    // A device that binds at most 1 MiB of storage: the 3 M-element set is
    // cut into a dozen windows, with tensors straddling their boundaries.
    let (device, queue, clipper) = common::device_with_binding_limit(1 << 20);

    let mut rng = Rng(5);
    let sizes = [262_143, 262_145, 1, 1_000_000, 0, 1_475_711];
    let n: usize = sizes.iter().sum();
    let data: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    for order in [Order::L2, Order::Inf, Order::P(1.5)] {
        let buffer = upload(&device, &data);
        let set = clipper
            .bind(&buffer, &GradLayout::from_sizes(&sizes).unwrap())
            .unwrap();
        assert_eq!(set.window_count(), n.div_ceil(1 << 18));
        let want = reference::norm(&data, order);
        let mut encoder = device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(1.0).norm(order.to_norm()))
            .unwrap();
        queue.submit([encoder.finish()]);
        let report = pollster::block_on(set.read_report()).unwrap();
        assert!(
            rel_diff(report.total_norm as f64, want) <= 1e-5,
            "{order:?}: {report:?} want {want:e}"
        );
        let after = download(&device, &queue, &buffer, n);
        assert_close(
            &after,
            &reference::torch_clipped(&data, want, 1.0),
            1e-5,
            &format!("{order:?}"),
        );
    }

    let buffer = upload(&device, &data);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&sizes).unwrap())
        .unwrap();
    let mut encoder = device.create_command_encoder(&Default::default());
    set.clip_value(&mut encoder, -0.25, 0.5).unwrap();
    queue.submit([encoder.finish()]);
    let want: Vec<f32> = data.iter().map(|g| g.clamp(-0.25, 0.5)).collect();
    assert_close(
        &download(&device, &queue, &buffer, n),
        &want,
        0.0,
        "clamp over windows",
    );
    assert_no_wgpu_errors();
}
