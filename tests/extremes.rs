//! Coefficients below f32::MIN_POSITIVE (exact on drivers that flush
//! subnormals, such as SwiftShader) and norm orders near the smallest
//! allowed p.

mod common;

use common::reference::{self, assert_close, Order};
use common::{assert_no_wgpu_errors, download, gpu, run_clip};
use gradclip::{ClipNorm, Error, GradLayout, Norm};

#[test]
fn a_coefficient_below_the_normal_range_scales_exactly() {
    // ‖g‖ ≈ 2.2e38: max_norm 1 gives a coefficient of ≈ 4.5e-39, a
    // subnormal f32. Gradients of 1e37 must become ≈ 4.5e-2, not 0.
    let mut data = vec![1e37f32; 100];
    data.extend([2e38, -3e37, 1e-30, 0.0]);
    let norm = reference::norm(&data, Order::L2);
    assert!(norm > 1e38 && norm < f32::MAX as f64);
    let (report, after) = run_clip(&data, &[60, 44], |set, enc| {
        set.clip_norm(enc, &ClipNorm::new(1.0))
    });
    let report = report.unwrap();
    let c = 1.0 / (norm + 1e-6);
    assert!(rel_ok(report.total_norm as f64, norm, 1e-6));
    assert!(report.coefficient > 0.0 && report.coefficient < f32::MIN_POSITIVE);
    let want: Vec<f32> = data.iter().map(|&x| (x as f64 * c) as f32).collect();
    // Every element within 1e-6 of float64 (the 1e-30 one is a subnormal
    // product: within one subnormal ulp, which is 0 here).
    assert_close(
        &after[..103],
        &want[..103],
        1e-6,
        "clipped by a subnormal coefficient",
    );
    assert_eq!(after[103], 0.0);
    assert!(after[0] > 4e-2, "1e37 * 4.5e-39 = {}", after[0]);
    assert_no_wgpu_errors();
}

#[test]
fn a_subnormal_coefficient_in_tensorflow_semantics() {
    let data = [3e38f32, 1e38, -2e38];
    let norm = reference::norm(&data, Order::L2);
    let (report, after) = run_clip(&data, &[3], |set, enc| {
        set.clip_norm(enc, &ClipNorm::tensorflow(1e-3))
    });
    assert!(report.unwrap().coefficient < f32::MIN_POSITIVE);
    let want = reference::tensorflow_clipped(&data, norm, 1e-3);
    assert_close(&after, &want, 1e-6, "tf");

    assert_no_wgpu_errors();
}

fn rel_ok(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs()
}

#[test]
fn tiny_p_norms_overflow_to_inf_and_clip_to_zero() {
    // (2 · 4^1e-10)^(1e10) and (Σ (k·1e30)^1e-10)^(1e10) are far above f32:
    // PyTorch's norm is inf and its coefficient 1/(inf + 1e-6) = 0.
    for data in [vec![4.0f32, 4.0], vec![1e30, 2e30, 3e30]] {
        let (report, after) = run_clip(&data, &[data.len()], |set, enc| {
            set.clip_norm(enc, &ClipNorm::new(1.0).norm(Norm::P(1e-10)))
        });
        let report = report.unwrap();
        assert_eq!(report.total_norm, f32::INFINITY, "{data:?}");
        assert_eq!(report.coefficient, 0.0, "{data:?}");
        assert!(after.iter().all(|&x| x == 0.0), "{data:?} -> {after:?}");
    }
    // One nonzero element: the norm is that element, whatever p.
    let (report, after) = run_clip(&[0.0, -0.75, 0.0], &[3], |set, enc| {
        set.clip_norm(enc, &ClipNorm::new(1.0).norm(Norm::P(Norm::MIN_P)))
    });
    // Within one ulp (s^(1/p) with s = 1 goes through exp2/log2).
    let norm = report.unwrap().total_norm;
    assert!(
        (norm.to_bits() as i64 - 0.75f32.to_bits() as i64).abs() <= 1,
        "{norm}"
    );
    assert_eq!(after, [0.0, -0.75, 0.0]);
    assert_no_wgpu_errors();
}

#[test]
fn p_below_the_minimum_is_rejected_before_recording() {
    let g = gpu();
    let buffer = common::upload(&g.device, &[1.0, 1.0]);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[2]).unwrap())
        .unwrap();
    for p in [1e-39f32, 0.0, -1.0, f32::NAN, Norm::MIN_P / 2.0] {
        let mut encoder = g.device.create_command_encoder(&Default::default());
        assert!(matches!(
            set.clip_norm(&mut encoder, &ClipNorm::new(1.0).norm(Norm::P(p))),
            Err(Error::InvalidNormOrder(_))
        ));
        g.queue.submit([encoder.finish()]);
    }
    assert_eq!(download(&g.device, &g.queue, &buffer, 2), [1.0, 1.0]);
    assert!(matches!(
        pollster::block_on(set.read_report()),
        Err(Error::NoReport)
    ));
    assert_no_wgpu_errors();
}

#[test]
fn a_subnormal_norm_is_reported_exactly() {
    // One element of 2^-126 * 0.64: its L2, Inf and L1 norms are that
    // subnormal value, which drivers that flush (SwiftShader) must not
    // turn into 0.
    let x = f32::from_bits(0x0051_fa3c);
    assert!(x < f32::MIN_POSITIVE && x > 0.0);
    for norm in [Norm::L2, Norm::Inf, Norm::L1] {
        let (report, after) = run_clip(&[0.0, -x, 0.0], &[1, 2], |set, enc| {
            set.clip_norm(enc, &ClipNorm::new(1.0).norm(norm))
        });
        assert_eq!(report.unwrap().total_norm, x, "{norm:?}");
        assert_eq!(after[1].to_bits(), (-x).to_bits(), "{norm:?}");
    }
    assert_no_wgpu_errors();
}
