//! Coefficients below f32::MIN_POSITIVE (exact on drivers that flush
//! subnormals, such as SwiftShader) and norm orders near the smallest
//! allowed p.

use crate::common;

use common::adaptive_reference::Rng;
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

#[test]
fn norms_of_subnormal_only_data_are_not_flushed() {
    // Thousands of subnormals (and zeros): every reduction decodes them on
    // the bits, the general p one for every element, so their norms must
    // match float64 on drivers that flush too.
    let mut rng = Rng::new(0x5851_f42d_4c95_7f2d);
    let data: Vec<f32> = (0..50_000)
        .map(|i| {
            let bits = (rng.next_u64() >> 41) as u32 & 0x007f_ffff;
            let x = f32::from_bits(bits >> (i % 23));
            if i % 2 == 0 {
                x
            } else {
                -x
            }
        })
        .collect();
    for order in [
        Order::L2,
        Order::Inf,
        Order::P(1.0),
        Order::P(3.0),
        Order::P(1.5),
        Order::P(0.5),
    ] {
        let want = reference::norm(&data, order);
        assert!(want > 0.0, "{order:?}");
        let (report, _) = run_clip(&data, &[30_001, 19_999], |set, enc| {
            set.clip_norm(enc, &ClipNorm::new(1.0).norm(order.to_norm()))
        });
        let got = report.unwrap().total_norm as f64;
        assert!(
            rel_ok(got, want, 1e-5),
            "{order:?}: got {got:e}, want {want:e}"
        );
    }
    assert_no_wgpu_errors();
}

#[test]
fn general_p_norms_do_not_depend_on_the_elements_order() {
    // The general p reduce takes each invocation's terms relative to a
    // reference that follows the running maximum, rescaling its sums when
    // that maximum moves far: ascending data moves it the most often.
    // Magnitudes log-uniform over 2^-100 .. 2^100, ascending, descending
    // and shuffled, under small, fractional and large p; and ascending from
    // the smallest subnormal to 2^60, where the reference starts among
    // subnormals (where it moves at every rise) and, for p = 0.25, its
    // limit soon lies past f32::MAX. Each norm within 2e-6 of float64.
    let n = 40_000usize;
    let log_uniform = |lo: f64, hi: f64| -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (lo + (hi - lo) * i as f64 / n as f64).exp2() as f32;
                if i % 3 == 0 {
                    -x
                } else {
                    x
                }
            })
            .collect()
    };
    let ascending = log_uniform(-100.0, 100.0);
    let descending: Vec<f32> = ascending.iter().rev().copied().collect();
    let mut shuffled = ascending.clone();
    let mut rng = Rng::new(0x0bad_5eed_1234_5678);
    for i in (1..n).rev() {
        shuffled.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let whole_range = log_uniform(-149.0, 60.0);
    assert!(whole_range[..100].iter().all(|x| x.is_subnormal()));
    let orders = [0.5, 1.5, 2.5, 7.3, 40.0];
    let mut worst = 0.0f64;
    for (name, data, ps) in [
        ("ascending", &ascending, &orders[..]),
        ("descending", &descending, &orders),
        ("shuffled", &shuffled, &orders),
        ("whole range", &whole_range, &[0.25, 1.5, 7.3, 1000.0]),
    ] {
        for &p in ps {
            let want = reference::norm(data, Order::P(p));
            let (report, _) = run_clip(data, &[n / 2, n - n / 2], |set, enc| {
                set.clip_norm(enc, &ClipNorm::new(1.0).norm(Norm::P(p as f32)))
            });
            let got = report.unwrap().total_norm as f64;
            let err = (got - want).abs() / want;
            worst = worst.max(err);
            println!("{name} p = {p}: relative error {err:e}");
        }
    }
    assert!(worst <= 2e-6, "worst relative error {worst:e}");
    assert_no_wgpu_errors();
}

#[test]
fn products_that_leave_the_normal_range_mid_run_are_exact() {
    // The scale pass stores plain products while they are normal numbers
    // and goes exact from the first block where one is not (a subnormal or
    // flushed product): tiny gradients scattered through long runs, at the
    // start, the middle and the end of invocations' walks, must come out
    // as the exact product, and every other element exactly once scaled.
    let sizes = [70_001usize, 3, 40_000, 129, 65_536];
    let n: usize = sizes.iter().sum();
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut data: Vec<f32> = (0..n)
        .map(|_| {
            let r = rng.next_u64();
            let v = 1.0 + (r >> 40) as f32 / (1u64 << 24) as f32;
            if r & 1 == 0 {
                v
            } else {
                -v
            }
        })
        .collect();
    // One tiny element in about 3000, a run of them, zeros of both signs.
    for x in &mut data {
        let r = rng.next_u64();
        if r.is_multiple_of(3000) {
            let tiny = f32::from_bits(0x0080_0000 + (r >> 40) as u32 % 0x0100_0000);
            *x = if r & 2 == 0 { tiny } else { -tiny };
        } else if r % 3000 == 1 {
            *x = f32::from_bits(1 + (r >> 44) as u32 % 0x007f_ffff); // subnormal g
        } else if r % 3000 == 2 {
            *x = if r & 2 == 0 { 0.0 } else { -0.0 };
        }
    }
    data[0] = 3e-38;
    data[n - 1] = -2e-38;
    for x in &mut data[100_000..100_050] {
        *x = 1.5e-38;
    }
    let norm = reference::norm(&data, Order::L2);
    let (report, after) = run_clip(&data, &sizes, |set, enc| {
        set.clip_norm(enc, &ClipNorm::new(0.25))
    });
    let report = report.unwrap();
    assert!(rel_ok(report.total_norm as f64, norm, 1e-6));
    let c = report.coefficient;
    assert!(c > f32::MIN_POSITIVE && c < 1e-3, "coefficient {c}");
    let subnormal = assert_exact_products(&data, &after, |_| c);
    assert!(subnormal > 100, "only {subnormal} subnormal products");
    assert_no_wgpu_errors();
}

/// Checks that every `after[i]` is `data[i] * factor(i)` rounded once: bit
/// for bit where that is a normal number or zero from a zero, within one
/// subnormal ulp with the sign kept where it is subnormal or underflows.
/// Returns how many were of the second kind.
fn assert_exact_products(data: &[f32], after: &[f32], factor: impl Fn(usize) -> f32) -> usize {
    let mut subnormal = 0;
    for (i, (&g, &got)) in data.iter().zip(after).enumerate() {
        let c = factor(i);
        // Two f32 factors: the f64 product is exact, `as f32` rounds once.
        let want = (g as f64 * c as f64) as f32;
        if want.is_subnormal() || (want == 0.0 && g != 0.0) {
            subnormal += 1;
            let diff = (got.to_bits() as i64 & 0x7fff_ffff) - (want.to_bits() as i64 & 0x7fff_ffff);
            assert!(
                diff.abs() <= 1 && got.is_sign_negative() == g.is_sign_negative(),
                "element {i}: {g:e} * {c:e} gave {got:e}, want {want:e}"
            );
        } else {
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "element {i}: {g:e} * {c:e} gave {got:e}, want {want:e}"
            );
        }
    }
    subnormal
}

/// A random value of binade `exponent` (unbiased; below -126: a
/// subnormal), of random sign.
fn binade(rng: &mut Rng, exponent: i32) -> f32 {
    let r = rng.next_u64();
    let mantissa = (r >> 41) as u32 & 0x007f_ffff;
    let bits = if exponent < -126 {
        mantissa.max(1)
    } else {
        ((exponent + 127) as u32) << 23 | mantissa
    };
    let x = f32::from_bits(bits);
    if r & 1 == 0 {
        x
    } else {
        -x
    }
}

#[test]
fn elements_at_the_edges_of_the_plain_products_band_scale_exactly() {
    // The scale pass multiplies plainly while every |g| of a block is zero
    // or above a floor derived from the factor's exponent (products surely
    // normal), and exactly from the first block where one is not. Per-tensor
    // factors from 1 down to 2^-90 meet elements in the binades on both
    // sides of the floor, and below the normal range, scattered through
    // ordinary ones: every product must be the once-rounded one. The binade
    // just below the floor is the common one, so that a floor one binade
    // too low lets plain products through (and a driver that flushes
    // subnormals zeroes them).
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let tensor = 3000usize;
    let peaks: Vec<i32> = (-4..=90).step_by(6).collect();
    let mut data = Vec::new();
    for &k in &peaks {
        // max_norm 1 and a peak of 1.5 * 2^k: a factor of 2^-k / 1.5 (1 for
        // k < 0), whose plain products are normal from |g| = 2^(k - 125)
        // up (2^-126 for the factor 1). A g of the binade below has a
        // subnormal product when its mantissa is below 1.5.
        let edge = if k > 0 { k - 125 } else { -126 };
        for i in 0..tensor {
            let r = rng.next_u64() % 1024;
            let e = match r {
                0..=15 => edge - 1,
                16..=23 => edge,
                24..=31 => edge + 1,
                32 => edge - 2,
                33 => -140,
                _ => k - 12,
            };
            data.push(if i == 0 {
                1.5 * (k as f32).exp2()
            } else {
                binade(&mut rng, e)
            });
        }
        let zero = data.len() - 1 - k.rem_euclid(7) as usize;
        data[zero] = 0.0;
    }
    let sizes = vec![tensor; peaks.len()];
    let (report, after) = run_clip(&data, &sizes, |set, enc| {
        set.clip_norm(enc, &ClipNorm::new(1.0).per_tensor(true))
    });
    let coefficients = report.unwrap().tensor_coefficients;
    assert_eq!(coefficients.len(), peaks.len());
    for (&k, &c) in peaks.iter().zip(&coefficients) {
        let peak_times_c = if k < 0 {
            1.0
        } else {
            c * 1.5 * (k as f32).exp2()
        };
        assert!(
            c <= 1.0 && peak_times_c > 0.99 && peak_times_c <= 1.0,
            "2^{k}: {c:e}"
        );
    }
    let subnormal = assert_exact_products(&data, &after, |i| coefficients[i / tensor]);
    assert!(subnormal > 200, "only {subnormal} subnormal products");
    assert_no_wgpu_errors();
}

#[test]
fn a_factor_above_one_scales_exactly_up_to_the_largest_products() {
    // Unscaling by a loss scale of 2^-100 multiplies by 2^100: every normal
    // stored value has a normal product, up to 2^127 here (few enough for
    // the norm to stay finite), while subnormal ones, whose products are
    // normal too, must not take the plain product on a driver that flushes
    // its inputs (SwiftShader would give 0).
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let n = 20_000usize;
    let mut data: Vec<f32> = (0..n)
        .map(|i| match rng.next_u64() % 2000 {
            0 => binade(&mut rng, 24),
            1..=40 => binade(&mut rng, -140),
            41..=50 => 0.0,
            _ if i % 9000 == 17 => binade(&mut rng, 25),
            _ => binade(&mut rng, -10),
        })
        .collect();
    data[12_345] = binade(&mut rng, 26);
    let (report, after) = run_clip(&data, &[7_001, n - 7_001], |set, enc| {
        set.set_loss_scaler(&gradclip::LossScaler::new().init_scale((-100f32).exp2()))?;
        set.clip_norm(enc, &ClipNorm::new(f32::MAX).unscale(true))
    });
    let report = report.unwrap();
    assert!(
        !report.found_inf && report.total_norm.is_finite(),
        "{report:?}"
    );
    assert_eq!(report.coefficient, 100f32.exp2());
    assert_exact_products(&data, &after, |_| report.coefficient);
    assert!(after.iter().any(|x| x.abs() >= 126f32.exp2()));
    assert_no_wgpu_errors();
}
