//! Clipping breadth against the float64 reference: per-tensor norms and
//! clipping, split norm and clip across shards and devices, gradients spread
//! over several buffers, and ordered asynchronous reports.

use crate::common;

use common::reference::{self, assert_close, assert_identical, per_tensor_reference, Order};
use common::{
    assert_no_wgpu_errors, download, framework_clip, gpu, rel_diff, run_clip, upload, watch_errors,
    GRAD_USAGE,
};
use gradclip::{ClipNorm, GradLayout, Norm, NormPartial};
use wgpu::util::DeviceExt;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            u * [0.01, 1.0, 30.0][i % 3]
        })
        .collect()
}

fn split(data: &[f32], sizes: &[usize]) -> Vec<Vec<f32>> {
    let mut at = 0;
    sizes
        .iter()
        .map(|&n| {
            at += n;
            data[at - n..at].to_vec()
        })
        .collect()
}

/// Tensor t's norm and factor in `report`, as bits: the one-element tests
/// compare them across layouts exactly.
fn tensor_result_bits(report: &gradclip::ClipReport, t: usize) -> (u32, u32) {
    (
        report.tensor_norms[t].to_bits(),
        report.tensor_coefficients[t].to_bits(),
    )
}

const SIZES: [usize; 6] = [3000, 0, 17, 20_000, 9, 70_001];

#[test]
fn per_tensor_norms_are_reported_and_named() {
    let data = values(SIZES.iter().sum(), 1);
    let named: Vec<(String, usize)> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("layer{i}.weight"), n))
        .collect();
    let named: Vec<(&str, usize)> = named.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    let layout = GradLayout::from_named(&named).unwrap();
    for order in [Order::L2, Order::Inf, Order::P(1.0), Order::P(3.0)] {
        let clip = ClipNorm::new(1e30).norm(order.to_norm()).tensor_norms(true);
        let (report, after) = run_clip(&data, &SIZES, |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();
        let what = format!("{order:?}");
        reference::assert_tensor_norms(&report.tensor_norms, &data, &SIZES, order, 1e-5, &what);
        let names: Vec<&str> = report.named_norms(&layout).map(|(n, _)| n).collect();
        assert_eq!(names[3], "layer3.weight");
        assert_identical(&after, &data, "huge max_norm: untouched");
    }
    // Without asking, no per-tensor readback.
    let (report, _) = run_clip(&data, &SIZES, |set, enc| {
        set.clip_norm(enc, &ClipNorm::new(1.0))
    });
    assert!(report.unwrap().tensor_norms.is_empty());
}

#[test]
fn per_tensor_clipping_matches_clip_by_norm() {
    let data = values(SIZES.iter().sum(), 2);
    for tensorflow in [false, true] {
        for order in [Order::L2, Order::Inf, Order::P(1.5)] {
            let max_norm = 2.0f32;
            let base = framework_clip(tensorflow, max_norm);
            let clip = base.norm(order.to_norm()).per_tensor(true);
            let (report, after) = run_clip(&data, &SIZES, |set, enc| set.clip_norm(enc, &clip));
            let report = report.unwrap();
            let (norms, want) = per_tensor_reference(&data, &SIZES, order, max_norm, tensorflow);
            for (i, &norm) in norms.iter().enumerate() {
                assert!(
                    rel_diff(report.tensor_norms[i] as f64, norm) <= 1e-5,
                    "tensor {i}"
                );
            }
            let global = reference::norm(&data, order);
            assert!(
                rel_diff(report.total_norm as f64, global) <= 1e-5,
                "global norm still reported"
            );
            assert_close(
                &after,
                &want,
                1e-5,
                &format!("per tensor {order:?} tf={tensorflow}"),
            );
        }
    }
    check_inf_tensor(
        &data,
        &SIZES,
        (3, 5),
        0,
        2.0,
        "finite tensor beside an inf one",
    );
}

/// Clips `data` per tensor to `max_norm` with an inf at element `at.1` of
/// tensor `at.0`: that tensor's norm is inf and its elements follow
/// PyTorch (NaN for the inf, zero for the others); the finite tensor
/// `beside` is clipped by its own norm.
fn check_inf_tensor(
    data: &[f32],
    sizes: &[usize],
    at: (usize, usize),
    beside: usize,
    max_norm: f32,
    what: &str,
) {
    let mut data = data.to_vec();
    data[sizes[..at.0].iter().sum::<usize>() + at.1] = f32::INFINITY;
    let clip = ClipNorm::new(max_norm).per_tensor(true);
    let (report, after) = run_clip(&data, sizes, |set, enc| set.clip_norm(enc, &clip));
    let report = report.unwrap();
    assert!(
        report.nonfinite && report.tensor_norms[at.0].is_infinite(),
        "{what}"
    );
    let parts = split(&after, sizes);
    assert!(
        parts[at.0]
            .iter()
            .enumerate()
            .all(|(j, &g)| if j == at.1 { g.is_nan() } else { g == 0.0 }),
        "{what}"
    );
    let finite = &split(&data, sizes)[beside];
    let want =
        reference::torch_clipped(finite, reference::norm(finite, Order::L2), max_norm as f64);
    assert_close(&parts[beside], &want, 1e-5, what);
}

#[test]
fn fused_tensors_match_float64() {
    // Tensors of 1 to 40 and of 120 to 136 elements (each side of the
    // tiny runs of both kinds of device: 32 elements on GPUs, 128 on CPU
    // adapters) between some of 3000. The reduce pass gives the tiny ones
    // that lie whole in a flat chunk of several segments their norms and
    // factors itself, by plain_clip or (p = 1.5, a non-finite element) by
    // clip_of; tensor_stats gives the others theirs.
    let sizes: Vec<usize> = (0..600)
        .map(|i| match i % 100 {
            0 => 3000,
            k if k < 60 => 1 + k % 40,
            k => 120 + k % 17,
        })
        .collect();
    let data = values(sizes.iter().sum(), 12);
    for tensorflow in [false, true] {
        for order in [Order::L2, Order::Inf, Order::P(1.5)] {
            let mut norms: Vec<f64> = split(&data, &sizes)
                .iter()
                .map(|t| reference::norm(t, order))
                .collect();
            norms.sort_by(f64::total_cmp);
            // Half of the tensors clip.
            let max_norm = norms[norms.len() / 2] as f32;
            let base = framework_clip(tensorflow, max_norm);
            let clip = base.norm(order.to_norm()).per_tensor(true);
            let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
            let report = report.unwrap();
            let what = format!("{order:?} tf={tensorflow}");
            let (norms, want) = per_tensor_reference(&data, &sizes, order, max_norm, tensorflow);
            for (t, (&got, &norm)) in report.tensor_norms.iter().zip(&norms).enumerate() {
                assert!(
                    rel_diff(got as f64, norm) <= 1e-5,
                    "{what}: tensor {t} ({} elements) norm {got} vs {norm}",
                    sizes[t]
                );
            }
            assert_close(&after, &want, 1e-5, &what);
        }
    }
    // Only tensor 5 (6 elements, inside the first flat chunk) clips: the
    // reduce pass alone tells finalize that some tensor's factor is not 1.
    let small: Vec<f32> = split(&data, &sizes)
        .iter()
        .enumerate()
        .flat_map(|(t, g)| {
            let by = if t == 5 { 1e3 } else { 1e-4 };
            g.iter().map(move |&x| x * by).collect::<Vec<_>>()
        })
        .collect();
    let clip = ClipNorm::new(1.0).per_tensor(true);
    let (report, after) = run_clip(&small, &sizes, |set, enc| set.clip_norm(enc, &clip));
    assert!(report.unwrap().tensor_norms[5] > 1.0);
    let (_, want) = per_tensor_reference(&small, &sizes, Order::L2, 1.0, false);
    assert_close(&after, &want, 1e-5, "one fused tensor clips");
    // An inf in tensor 7 (8 elements), fused; tensor 8 beside it too.
    check_inf_tensor(
        &data,
        &sizes,
        (7, 3),
        8,
        0.5,
        "a fused tensor beside an inf one",
    );
    assert_no_wgpu_errors();
}

#[test]
fn tiny_tensors_of_zeros_match_float64() {
    // Tiny tensors (2 to 31 elements: tiny segments on every device)
    // between ordinary ones, most of them zeros: +0, -0, both, and zeros
    // with one element whose square leaves f32 (the smallest subnormal,
    // 1e-30) or is ordinary. The reduce pass keeps a tiny segment's plain
    // partial where its elements are all zeros (tiny_partial), and must
    // keep nothing else the plain sum's window would not: a tensor whose
    // only element is 2^-149 has that norm, not zero's. Unused parameters
    // give exactly such gradients.
    let mut sizes = Vec::new();
    let mut specials: Vec<(usize, f32)> = Vec::new();
    for k in 0..120 {
        let n = 2 + (k * 7) % 30;
        sizes.push(if k % 10 == 0 { 3000 } else { 300 });
        let t = sizes.len();
        sizes.push(n);
        specials.push((t, [0.0, -0.0, f32::from_bits(1), 1e-30, 0.75, 0.0][k % 6]));
    }
    sizes.push(500);
    let starts = starts_of(&sizes);
    let mut data = values(sizes.iter().sum(), 31);
    for (k, &(t, x)) in specials.iter().enumerate() {
        let tensor = &mut data[starts[t]..starts[t] + sizes[t]];
        for (i, g) in tensor.iter_mut().enumerate() {
            // Zeros of both signs; the special value, if not a zero, at one
            // place.
            *g = if (i + k) % 3 == 0 { -0.0 } else { 0.0 };
        }
        if x != 0.0 {
            tensor[(k * 5) % tensor.len()] = x;
        } else if k % 12 == 1 {
            tensor.fill(-0.0);
        }
    }
    for (tensorflow, order) in [
        (false, Order::L2),
        (true, Order::L2),
        (false, Order::Inf),
        (false, Order::P(3.0)),
        (true, Order::P(1.5)),
    ] {
        let what = format!("{order:?} tf={tensorflow}");
        let max_norm = 0.5f32;
        let clip = framework_clip(tensorflow, max_norm)
            .norm(order.to_norm())
            .per_tensor(true);
        let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();
        let (norms, want) = per_tensor_reference(&data, &sizes, order, max_norm, tensorflow);
        for &(t, _) in &specials {
            let (got, norm) = (report.tensor_norms[t], norms[t]);
            assert!(
                rel_diff(got as f64, norm) <= 1e-5 && (norm == 0.0) == (got == 0.0),
                "{what}: tiny tensor {t} ({} elements) norm {got:e} vs {norm:e}",
                sizes[t]
            );
            if norm == 0.0 {
                assert_eq!(
                    report.tensor_coefficients[t], 1.0,
                    "{what}: tensor {t} of zeros"
                );
            }
        }
        reference::assert_tensor_norms(&report.tensor_norms, &data, &sizes, order, 1e-5, &what);
        assert_close(&after, &want, 1e-5, &what);
    }
    assert_no_wgpu_errors();
}

#[test]
fn runs_of_one_element_tensors_match_float64_and_lone_ones_bits() {
    // Runs of one-element tensors, each the longest of its flat chunk (a
    // layout this size has chunks of shaders::MIN_CHUNK_ELEMENTS = 32768
    // elements on every device), starting at every offset in a quad, the
    // last across a chunk boundary, with two- and five-element tensors
    // after each and a shorter run beside the last; the reduce pass gives
    // the tensors of the whole quads of a chunk's longest run their results
    // a quad at a time (unit_stats), the others, those of a run's partial
    // quads among them, through its per-segment loop. Each
    // tensor's results must be those of a lone one-element tensor of the
    // same value, which takes the per-segment fold: the second layout
    // places every such tensor between two-element ones. Magnitudes span
    // the fast paths' limits (squares that overflow or underflow f32,
    // subnormals, zeros, inf and NaN), so some of a run's tensors take the
    // general path, and the unit walk's quick test's (factor 1 from a
    // compare): PyTorch's divisor x + 1e-6 either side of 2^-2, the power
    // of two at or below max_norm 0.25 and 0.3, TensorFlow's x either side
    // of 0.25, L2's squares at the edges of the plain sum's window.
    let runs: [(usize, usize); 9] = [
        (0, 2),
        (3, 3),
        (1, 5),
        (2, 7),
        (1, 9),
        (3, 300),
        (2, 4),
        (0, 13),
        (1, 5000),
    ];
    let mut sizes = Vec::new();
    let mut at = 0;
    for (k, &(offset, run)) in runs.iter().enumerate() {
        let target = if k + 1 == runs.len() {
            32768 * (k + 1) - 2000 + offset
        } else {
            32768 * k + 1000 + offset
        };
        sizes.push(target - at);
        sizes.extend(std::iter::repeat_n(1, run));
        sizes.extend([2, 5]);
        at = target + run + 7;
    }
    sizes.extend([1, 1, 1, 3000]);
    let specials = [
        0.0,
        -0.0,
        f32::from_bits(1),
        -1e-39,
        1e-30,
        -3e-20,
        1e19,
        -1e30,
        f32::MAX,
        0.5,
        // x + 1e-6 rounds to 0.25, and to just below it.
        0.25 - 1e-6,
        f32::from_bits((0.25f32 - 1e-6).to_bits() - 1),
        0.25,
        f32::from_bits(0.25f32.to_bits() + 1),
        -2f32.powi(-39),
        f32::from_bits(2f32.powi(-39).to_bits() - 1),
        2f32.powi(48),
        -f32::from_bits(2f32.powi(48).to_bits() - 1),
    ];
    let mut data = values(sizes.iter().sum(), 14);
    let starts = starts_of(&sizes);
    let ones: Vec<usize> = (0..sizes.len()).filter(|&t| sizes[t] == 1).collect();
    for &t in &ones {
        if let Some(&x) = specials.get(t % 23) {
            data[starts[t]] = x;
        }
    }
    // The lone layout: each one-element tensor between two-element ones
    // (of zeros, so that the global results are unchanged).
    let mut lone_sizes = Vec::new();
    let mut lone_data = Vec::new();
    let mut lone_index = Vec::new();
    for &t in &ones {
        lone_sizes.extend([2, 1]);
        lone_data.extend([0.0, 0.0, data[starts[t]]]);
        lone_index.push(lone_sizes.len() - 1);
    }
    lone_sizes.push(2);
    lone_data.extend([0.0, 0.0]);
    let lone_starts = starts_of(&lone_sizes);
    for (inf, nan) in [(None, None), (Some(40), Some(3001))] {
        let mut data = data.clone();
        let mut lone_data = lone_data.clone();
        for (k, x) in [(inf, f32::INFINITY), (nan, f32::NAN)] {
            if let Some(k) = k {
                data[starts[ones[k]]] = x;
                lone_data[lone_starts[lone_index[k]]] = x;
            }
        }
        for (tensorflow, order, max_norm) in [
            (false, Order::L2, 0.25f32),
            (true, Order::L2, 0.25),
            (false, Order::Inf, 0.25),
            (true, Order::Inf, 0.25),
            (false, Order::P(3.0), 0.3),
            (true, Order::P(1.5), 0.25),
            // A subnormal max_norm: plain_clip declines every tensor.
            (false, Order::L2, 1e-40),
            (true, Order::Inf, 1e-40),
        ] {
            let base = framework_clip(tensorflow, max_norm);
            let clip = base.norm(order.to_norm()).per_tensor(true);
            let what = format!("{order:?} tf={tensorflow} max_norm={max_norm:e} inf={inf:?}");
            let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
            let report = report.unwrap();
            let (lone, lone_after) = run_clip(&lone_data, &lone_sizes, |set, enc| {
                set.clip_norm(enc, &clip)
            });
            let lone = lone.unwrap();
            for (&t, &l) in ones.iter().zip(&lone_index) {
                let x = data[starts[t]];
                assert_eq!(
                    tensor_result_bits(&report, t),
                    tensor_result_bits(&lone, l),
                    "{what}: tensor {t} ({x:e}) against a lone one"
                );
                assert_identical(
                    &after[starts[t]..starts[t] + 1],
                    &lone_after[lone_starts[l]..lone_starts[l] + 1],
                    &format!("{what}: tensor {t} clipped"),
                );
                let want = (x as f64).abs();
                let got = report.tensor_norms[t] as f64;
                assert!(
                    (x.is_nan() && got.is_nan()) || rel_diff(got, want) <= 1e-6,
                    "{what}: tensor {t} norm {got:e} vs |x| = {want:e}"
                );
                // Inf by the bits, and p (integer or not) from a partial of
                // s = 1, which norm_value and plain_clip take without log2
                // and exp2: exactly |x|.
                if x.is_finite() && matches!(order, Order::Inf | Order::P(_)) {
                    assert_eq!(got, want, "{what}: tensor {t} norm, exactly |x|");
                }
            }
            if inf.is_none() && max_norm.is_normal() {
                let (_, want) = per_tensor_reference(&data, &sizes, order, max_norm, tensorflow);
                assert_close(&after, &want, 1e-5, &what);
            }
        }
    }
    assert_no_wgpu_errors();
}

#[test]
fn a_set_of_one_element_tensors_alone_matches_one_beside_other_tensors() {
    // A set of nothing but one-element tensors, 3 * 32768 + 1000 of them:
    // every flat chunk is all unit run (whole quads of the window on every
    // device), so its per-tensor reduce is the pipeline without the
    // segment paths (WGSL SEGMENTS off, plan::Plan::segments_outside_units).
    // With one tensor of two zeros after them the last chunk has a segment
    // outside its run, and the set takes the whole reduce_tensors. Each
    // tensor's norm, factor and clipped gradient must have the same bits
    // in both, the global norm the same bits with per-tensor results as
    // without, and the norms be |x|. Some values clip, some are zeros,
    // subnormals, an infinity or a NaN (the general path's queues), and a
    // subnormal max_norm sends every tensor there.
    let n = 3 * 32768 + 1000;
    let mut data = values(n, 23);
    let specials = [
        0.0,
        -0.0,
        f32::from_bits(3),
        -1e-39,
        1e19,
        -3e-20,
        0.3,
        -0.25,
        2.5,
    ];
    for (k, x) in specials.iter().enumerate() {
        for at in (k * 997..n).step_by(9973) {
            data[at] = *x;
        }
    }
    let sizes = vec![1usize; n];
    let mut beside_sizes = sizes.clone();
    beside_sizes.push(2);
    for (inf, nan) in [(None, None), (Some(40_000), Some(77_777))] {
        let mut data = data.clone();
        for (k, x) in [(inf, f32::INFINITY), (nan, f32::NAN)] {
            if let Some(k) = k {
                data[k] = x;
            }
        }
        let mut beside = data.clone();
        beside.extend([0.0, 0.0]);
        for (tensorflow, order, max_norm) in [
            (false, Order::L2, 0.25f32),
            (true, Order::L2, 0.25),
            (false, Order::Inf, 0.25),
            (false, Order::P(3.0), 0.3),
            (true, Order::P(1.5), 0.25),
            (false, Order::L2, 1e-40),
        ] {
            let base = framework_clip(tensorflow, max_norm).norm(order.to_norm());
            let clip = base.per_tensor(true);
            let what = format!("{order:?} tf={tensorflow} max_norm={max_norm:e} inf={inf:?}");
            let (alone, alone_after) =
                run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
            let alone = alone.unwrap();
            let (with, with_after) =
                run_clip(&beside, &beside_sizes, |set, enc| set.clip_norm(enc, &clip));
            let with = with.unwrap();
            let (plain, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &base));
            let plain = plain.unwrap();
            assert_eq!(
                alone.total_norm.to_bits(),
                plain.total_norm.to_bits(),
                "{what}: the global norm with per-tensor results and without"
            );
            for (t, &x) in data.iter().enumerate() {
                assert_eq!(
                    tensor_result_bits(&alone, t),
                    tensor_result_bits(&with, t),
                    "{what}: tensor {t} ({x:e}) alone and beside a two-element tensor"
                );
                let got = alone.tensor_norms[t] as f64;
                let want = (x as f64).abs();
                assert!(
                    (x.is_nan() && got.is_nan()) || rel_diff(got, want) <= 1e-6,
                    "{what}: tensor {t} norm {got:e} vs |x| = {want:e}"
                );
            }
            assert_identical(&alone_after, &with_after[..n], &format!("{what}: clipped"));
            if inf.is_none() && max_norm.is_normal() {
                let (_, want) = per_tensor_reference(&data, &sizes, order, max_norm, tensorflow);
                assert_close(&alone_after, &want, 1e-5, &what);
                let clipped = (0..n)
                    .filter(|&t| alone.tensor_coefficients[t] < 1.0)
                    .count();
                assert!(
                    clipped > 0 && clipped < n,
                    "{what}: {clipped} of {n} tensors clip"
                );
            }
        }
    }
    assert_no_wgpu_errors();
}

#[test]
fn one_element_tensors_unscale_before_their_factor() {
    // A run of one-element tensors, which the reduce pass gives their
    // results in its walk over the run, in a per-tensor clip that unscales
    // by S = 512: each tensor's norm must be |g| / S and its factor
    // min(1, 1 / (norm + 1e-6)) / S, though all but the last have |g|
    // below max_norm even before unscaling, where the walk's quick path
    // (factor 1 by a compare, for clips that do not unscale) would take
    // them. The last clips. (A 16-bit set pads each one-element tensor to
    // two elements, so only an f32 set has such runs.)
    let scale = 512.0f32;
    let mut sizes = vec![3000, 501];
    sizes.extend([1; 600]);
    sizes.push(7000);
    let starts = starts_of(&sizes);
    let mut data = values(sizes.iter().sum(), 16);
    for t in 2..602 {
        data[starts[t]] = ((t % 97) as f32 / 97.0 - 0.5) * 0.9;
    }
    data[starts[601]] = 900.0;
    clip_unscaled_per_tensor(&data, &sizes, scale);
    assert_no_wgpu_errors();
}

/// Clips `data` per tensor (PyTorch, max_norm 1) unscaling by a loss
/// scale `scale`, and checks every tensor's norm (of g / S), factor
/// (min(1, 1 / (norm + 1e-6)) / S) and gradients against float64.
/// Returns how many tensors clipped.
fn clip_unscaled_per_tensor(data: &[f32], sizes: &[usize], scale: f32) -> usize {
    let starts = starts_of(sizes);
    let clip = ClipNorm::new(1.0).per_tensor(true).unscale(true);
    let (report, after) = run_clip(data, sizes, |set, enc| {
        set.set_loss_scaler(&gradclip::LossScaler::new().init_scale(scale))?;
        set.clip_norm(enc, &clip)
    });
    let report = report.unwrap();
    assert!(!report.found_inf, "{report:?}");
    let mut clipped = 0;
    for t in 0..sizes.len() {
        let tensor = &data[starts[t]..starts[t] + sizes[t]];
        let norm = reference::norm(tensor, Order::L2) / scale as f64;
        let coef = reference::torch_coefficient(norm, 1.0) / scale as f64;
        let (got_norm, got_coef) = (
            report.tensor_norms[t] as f64,
            report.tensor_coefficients[t] as f64,
        );
        assert!(
            rel_diff(got_norm, norm) <= 1e-6 && rel_diff(got_coef, coef) <= 1e-6,
            "tensor {t}: norm {got_norm:e} factor {got_coef:e}, want {norm:e} and {coef:e}"
        );
        clipped += usize::from(coef * (scale as f64) < 1.0);
        for (i, (&x, &y)) in tensor.iter().zip(&after[starts[t]..]).enumerate() {
            assert!(
                rel_diff(y as f64, x as f64 * coef) <= 1e-6,
                "tensor {t} element {i}: {y:e}, want {x:e} x {coef:e}"
            );
        }
    }
    clipped
}

#[test]
fn tensor_stats_general_path_takes_whole_blocks() {
    // 2 501 tensors of 200 elements, too long for the reduce pass to give
    // them their results and short enough for one invocation each to fold
    // (tensor_stats), in a per-tensor clip that unscales: plain_clip takes
    // none of them, so every tensor of every block an invocation takes
    // goes to its queue of the general path (shaders::TENSOR_STAT_BLOCK
    // bits, all of them set on adapters that give an invocation a whole
    // block), the last block short. Every norm, factor and gradient
    // against float64.
    let scale = 256.0f32;
    let sizes = vec![200; 2501];
    let starts = starts_of(&sizes);
    let mut data = values(sizes.iter().sum(), 23);
    for t in (0..sizes.len()).step_by(7) {
        // Some tensors well above max_norm once unscaled, the rest below.
        data[starts[t]] = 4000.0;
    }
    let clipped = clip_unscaled_per_tensor(&data, &sizes, scale);
    assert!(
        clipped > 300 && clipped < sizes.len(),
        "{clipped} tensors clipped"
    );
    assert_no_wgpu_errors();
}

#[test]
fn one_element_tensors_have_norm_x_wherever_they_lie() {
    // A tensor of one element x has norm |x| for every p, and gradclip gives
    // exactly that for p too (an integer p's plain partial, |x|^p, would come
    // back through a rounded root), wherever the tensor lies: first and
    // last in tracked chunks (each chunk of shaders::MIN_CHUNK_ELEMENTS =
    // 32768 elements here: a one-element tensor, ten of 3000 elements, one
    // of 2766, a one-element tensor), between long tensors in the last
    // chunk, which that makes untracked (its shortest inner segment is
    // shorter than a tracked round), so that its long tensors take the
    // per-segment fold's lists, and alone, where its norm is also the
    // global one. (Runs of them, and those between short tensors:
    // runs_of_one_element_tensors_match_float64_and_lone_ones_bits.) With
    // the lists, the set takes the same pipelines as the other per-tensor
    // tests of these norms, and no pipelines of its own.
    let chunks = 8;
    let mut sizes = Vec::new();
    for chunk in 0..chunks {
        sizes.push(1);
        if chunk + 1 < chunks {
            sizes.extend([3000; 10]);
            sizes.extend([2766, 1]);
        } else {
            sizes.extend([3000; 5]);
            sizes.push(1);
            sizes.extend([3000; 5]);
            sizes.extend([2765, 1]);
        }
    }
    let starts = starts_of(&sizes);
    let mut data = values(starts[sizes.len() - 1] + 1, 15);
    let ones: Vec<usize> = (0..sizes.len()).filter(|&t| sizes[t] == 1).collect();
    let specials = [3.7e-39f32, -0.0, 1e-30, -7.3e25];
    for (k, &t) in ones.iter().enumerate() {
        // Magnitudes from 2^-100 to 2^100, some subnormal or zero.
        let x = data[starts[t]] * 2f32.powi(k as i32 * 13 - 100);
        data[starts[t]] = specials.get(k % 5).copied().unwrap_or(x);
    }
    // p = 8: |x|^p overflows f32 from 2^16 (and is the power the other
    // per-tensor tests use).
    for (tensorflow, order) in [
        (false, Order::P(1.0)),
        (true, Order::P(3.0)),
        (false, Order::P(8.0)),
        (true, Order::P(1.5)),
        (false, Order::Inf),
    ] {
        let clip = framework_clip(tensorflow, 0.25)
            .norm(order.to_norm())
            .per_tensor(true);
        let what = format!("{order:?} tf={tensorflow}");
        let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();
        for (k, &t) in ones.iter().enumerate() {
            let x = data[starts[t]];
            let norm = report.tensor_norms[t];
            assert_eq!(norm, x.abs(), "{what}: tensor {t} ({x:e}), norm");
            if k % 3 == 0 {
                let (lone, lone_after) = run_clip(&[x], &[1], |set, enc| set.clip_norm(enc, &clip));
                let lone = lone.unwrap();
                assert_eq!(lone.total_norm, x.abs(), "{what}: {x:e} alone, global norm");
                assert_eq!(
                    (norm.to_bits(), report.tensor_coefficients[t].to_bits()),
                    (
                        lone.tensor_norms[0].to_bits(),
                        lone.tensor_coefficients[0].to_bits()
                    ),
                    "{what}: tensor {t} ({x:e}) against it alone"
                );
                assert_identical(&after[starts[t]..starts[t] + 1], &lone_after, &what);
            }
        }
        let (_, want) = per_tensor_reference(&data, &sizes, order, 0.25, tensorflow);
        assert_close(&after, &want, 1e-5, &what);
    }
    assert_no_wgpu_errors();
}

#[test]
fn a_general_p_unit_run_hands_the_rest_of_its_walk_on() {
    // For a general p the reduce pass gives a run of one-element tensors
    // their results in its flat walk (reduce.wgsl, reduce_flat_units_p)
    // while every tensor of a step has factor 1 and a normal or zero
    // element, and leaves the rest of the invocation's share to a second
    // walk: from a tensor that clips, from a non-finite element (which ends
    // the flat walk), and the quads short of a step. Here the run's
    // magnitudes rise from 2^-20 to 2^20 every 600 tensors, within any
    // invocation's share of a chunk (it spans 1024 elements) by more than
    // the walk's span of 2^(32 / p), so that its reference moves
    // (p_walk_rise) between visits; and in the second layout one
    // tensor clips and a later one is infinite, each deep inside a share
    // whose earlier tensors are all visited. Every tensor's norm must be
    // exactly |x| and its factor that of float64, and the global results
    // those of the clip without per-tensor results.
    let run = 6000;
    let mut sizes = vec![3];
    sizes.extend(std::iter::repeat_n(1, run));
    sizes.push(2001);
    let n: usize = sizes.iter().sum();
    let mut data = values(n, 16);
    for (k, x) in data[3..3 + run].iter_mut().enumerate() {
        let scale = 2f32.powi((k % 600 * 41 / 600) as i32 - 20);
        *x = (0.5 + (*x).abs() / 60.0) * scale * if k % 2 == 0 { 1.0 } else { -1.0 };
    }
    let max_norm = 1e12;
    for (clips, inf) in [(None, None), (Some(1901), Some(2203))] {
        let mut data = data.clone();
        if let Some(k) = clips {
            data[3 + k] = -3e12;
        }
        if let Some(k) = inf {
            data[3 + k] = f32::INFINITY;
        }
        let clip = ClipNorm::new(max_norm).norm(Norm::P(1.5));
        let what = format!("clips={clips:?} inf={inf:?}");
        let (plain, plain_after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let plain = plain.unwrap();
        let per_tensor = clip.per_tensor(true);
        let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &per_tensor));
        let report = report.unwrap();
        assert_eq!(
            (report.total_norm.to_bits(), report.partial.to_bytes()),
            (plain.total_norm.to_bits(), plain.partial.to_bytes()),
            "{what}: per_tensor(true) moved the global results"
        );
        if inf.is_none() {
            assert_identical(&plain_after, &data, &format!("{what}: the global clip"));
        }
        let (norms, want) = per_tensor_reference(&data, &sizes, Order::P(1.5), max_norm, false);
        for t in 1..=run {
            let x = data[t + 2];
            assert_eq!(
                report.tensor_norms[t],
                x.abs(),
                "{what}: tensor {t} ({x:e}), norm"
            );
            let factor = report.tensor_coefficients[t] as f64;
            let expect = (max_norm as f64 / (norms[t] + 1e-6)).min(1.0);
            assert!(
                rel_diff(factor, expect) <= 1e-6,
                "{what}: tensor {t} ({x:e}) factor {factor:e} against {expect:e}"
            );
        }
        assert_close(&after, &want, 1e-6, &what);
    }
    assert_no_wgpu_errors();
}

/// Where each tensor of a packed layout of `sizes` starts.
fn starts_of(sizes: &[usize]) -> Vec<usize> {
    sizes
        .iter()
        .scan(0, |at, &n| {
            *at += n;
            Some(*at - n)
        })
        .collect()
}

#[test]
fn per_tensor_norms_keep_their_bits_whichever_path_takes_them() {
    // The per-tensor statistics take a tensor's norm and factor on a plain
    // path (plain_clip; tensor_clip in tensor_stats, which roots any p
    // partial) or the general one (clip_of), by the same arithmetic. A
    // subnormal max_norm sends every tensor to clip_of: the norms must keep
    // their bits. Tensors of every size class (one element, tiny ones the
    // reduce pass fuses, tracked ones, ones across chunks), magnitudes
    // whose p-norms are ordinary, huge, subnormal or overflow.
    let mut sizes = vec![3000, 1, 17, 20_000, 9, 70_001, 2, 40_000, 33];
    sizes.extend([500; 40]);
    sizes.extend([700, 600, 800]);
    let starts = starts_of(&sizes);
    let mut data = values(sizes.iter().sum(), 23);
    let scales = [
        (1, 1e30f32),
        (6, 1e-30),
        (7, 1e-36),
        (41, 3e38),
        (43, 1e-41),
    ];
    for (t, scale) in scales {
        for g in &mut data[starts[t]..starts[t] + sizes[t]] {
            *g *= scale;
        }
    }
    for order in [
        Order::L2,
        Order::Inf,
        Order::P(1.0),
        Order::P(3.0),
        Order::P(8.0),
        Order::P(1.5),
    ] {
        for tensorflow in [false, true] {
            let what = format!("{order:?} tf={tensorflow}");
            let norms = |max_norm: f32| {
                let clip = framework_clip(tensorflow, max_norm)
                    .norm(order.to_norm())
                    .per_tensor(true);
                let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
                (report.unwrap(), after)
            };
            let (plain, after) = norms(0.25);
            let (general, _) = norms(1e-40);
            assert_eq!(plain.tensor_norms.len(), sizes.len(), "{what}");
            let pairs = plain.tensor_norms.iter().zip(&general.tensor_norms);
            for (t, (&a, &b)) in pairs.enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{what}: tensor {t} ({} elements), {a:e} vs clip_of's {b:e}",
                    sizes[t]
                );
            }
            let (want_norms, want) = per_tensor_reference(&data, &sizes, order, 0.25, tensorflow);
            for (t, &want) in want_norms.iter().enumerate() {
                let got = plain.tensor_norms[t] as f64;
                let overflows = want > f32::MAX as f64;
                assert!(
                    (overflows && got.is_infinite()) || rel_diff(got, want) <= 1e-5,
                    "{what}: tensor {t} norm {got:e} vs {want:e}"
                );
            }
            assert_close(&after, &want, 1e-5, &what);
        }
    }
    assert_no_wgpu_errors();
}

#[test]
fn long_tensors_fold_on_a_workgroup_each() {
    // A tensor of more partials than a workgroup has invocations is folded
    // by a workgroup of tensor_stats, the others by one invocation each
    // (or by the reduce pass, fused). Three long tensors, one ordinary, one
    // huge and one tiny (Blue's big and small bins, p-sums far from 1),
    // between tensors of every other kind; a subnormal max_norm sends every
    // tensor to clip_of, which must give the plain path's bits.
    let g = gpu();
    let wg = g.clipper.workgroup_size() as usize;
    let long = (wg + 3) * 32768;
    let sizes = [3, long, 5, 40_000, long + 1, 1, 1, 1, long + 2, 7];
    let starts = starts_of(&sizes);
    let mut data = values(sizes.iter().sum(), 31);
    for (t, scale) in [(4, 1e30f32), (8, 1e-30)] {
        for x in &mut data[starts[t]..starts[t] + sizes[t]] {
            *x *= scale;
        }
    }
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let buffer = upload(&g.device, &data);
    let chunk = g.clipper.bind(&buffer, &layout).unwrap().chunk_elements() as usize;
    drop(buffer);
    assert!(
        long / chunk > wg,
        "chunks of {chunk}: {long} elements are not long for workgroups of {wg}"
    );
    for order in [Order::L2, Order::Inf, Order::P(3.0), Order::P(1.5)] {
        let what = format!("{order:?}");
        let clip = |max_norm: f32| {
            let clip = ClipNorm::new(max_norm)
                .norm(order.to_norm())
                .per_tensor(true);
            let (report, after) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
            (report.unwrap(), after)
        };
        let (plain, after) = clip(0.25);
        let (general, _) = clip(1e-40);
        for (t, (&a, &b)) in plain
            .tensor_norms
            .iter()
            .zip(&general.tensor_norms)
            .enumerate()
        {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{what}: tensor {t}, {a:e} vs clip_of's {b:e}"
            );
        }
        let (want_norms, want) = per_tensor_reference(&data, &sizes, order, 0.25, false);
        for (t, &want) in want_norms.iter().enumerate() {
            let got = plain.tensor_norms[t] as f64;
            assert!(
                rel_diff(got, want) <= 1e-5,
                "{what}: tensor {t} ({} elements) norm {got:e} vs {want:e}",
                sizes[t]
            );
        }
        assert_close(&after, &want, 1e-5, &what);
    }
    assert_no_wgpu_errors();
}

#[test]
fn a_long_tensor_over_many_windows_keeps_the_global_bits() {
    // Binding windows of 65 536 elements cut a tensor of WG + 4 chunks of
    // 32 768 into segments in many windows; its partials stay one range,
    // which long_tensor_stats folds as finalize folds the flat chunks.
    let (device, queue, clipper) = common::device_with_binding_limit(256 << 10);
    let wg = clipper.workgroup_size() as usize;
    let n = (wg + 4) * 32768;
    let data = values(n, 41);
    let buffer = upload(&device, &data);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&[n]).unwrap())
        .unwrap();
    let chunk = set.chunk_elements() as usize;
    assert!(
        n / chunk > wg,
        "chunks of {chunk}: not long for workgroups of {wg}"
    );
    assert!(set.window_count() >= 16, "{} windows", set.window_count());
    for order in [Order::L2, Order::Inf, Order::P(1.5)] {
        let what = format!("{order:?} over {} windows", set.window_count());
        let clip = ClipNorm::new(0.25).norm(order.to_norm());
        let mut runs = Vec::new();
        for clip in [clip, clip.per_tensor(true)] {
            queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&data));
            let mut encoder = device.create_command_encoder(&Default::default());
            set.clip_norm(&mut encoder, &clip).unwrap();
            queue.submit([encoder.finish()]);
            let report = pollster::block_on(set.read_report()).unwrap();
            runs.push((report, common::download_all(&device, &queue, &buffer)));
        }
        let (global, per_tensor) = (&runs[0], &runs[1]);
        assert_eq!(
            (
                per_tensor.0.tensor_norms[0].to_bits(),
                per_tensor.0.tensor_coefficients[0].to_bits()
            ),
            (
                global.0.total_norm.to_bits(),
                global.0.coefficient.to_bits()
            ),
            "{what}: the tensor's norm and factor against the global ones"
        );
        assert_identical(&per_tensor.1, &global.1, &what);
        let want = reference::norm(&data, order);
        assert!(rel_diff(global.0.total_norm as f64, want) <= 1e-5, "{what}");
    }
    assert_no_wgpu_errors();
}

#[test]
fn tracked_segments_a_fast_path_declines_are_folded_exactly() {
    // 40 tensors of 200 to 299 elements make one flat chunk whose every
    // segment the reduce pass folds in its flat walk, on GPUs and CPU
    // adapters alike, so the pipeline has no lists of long segments
    // (FOLD_LISTS off): the segments whose tracked sum a fast path cannot
    // keep (an inf, squares or cubes that overflow or underflow f32) are
    // folded again by exact_quads in the invocation that met them, and the
    // flat chunk's own sum, out of the fast path's window too, by the
    // general path. For a general p, the slots after the inf in its lane,
    // and the parts of segments after the 1e30 tensor whose terms are
    // far below the walk's reference (reduce.wgsl, p_slot).
    let sizes: Vec<usize> = (0..40).map(|i| 200 + (i * 7919) % 100).collect();
    let mut data = values(sizes.iter().sum(), 13);
    let start = |t: usize| sizes[..t].iter().sum::<usize>();
    data[start(5) + 150] = f32::INFINITY;
    for x in &mut data[start(9)..start(10)] {
        *x *= 1e30;
    }
    for x in &mut data[start(13)..start(14)] {
        *x *= 1e-30;
    }
    for order in [Order::L2, Order::Inf, Order::P(3.0), Order::P(1.5)] {
        let clip = ClipNorm::new(1.0).norm(order.to_norm());
        let (plain, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let clip = clip.tensor_norms(true);
        let (report, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        let report = report.unwrap();
        assert_eq!(
            plain.unwrap().partial.to_bytes(),
            report.partial.to_bytes(),
            "{order:?}: tensor_norms moved the global partial"
        );
        assert!(report.nonfinite && report.tensor_norms[5].is_infinite());
        let what = format!("{order:?}, tracked segments with extreme elements");
        reference::assert_tensor_norms(&report.tensor_norms, &data, &sizes, order, 1e-5, &what);
    }
    assert_no_wgpu_errors();
}

#[test]
fn a_set_of_tracked_chunks_alone_matches_one_beside_an_untracked_chunk() {
    // Tensors of 129 to 2 047 elements filling three flat chunks of 32768
    // exactly: every chunk holds several segments and is tracked on GPUs
    // and CPU adapters alike (for a general p at least on CPU adapters),
    // so the set's per-tensor reduce is the pipeline with the tracked walk
    // alone (WGSL UNTRACKED off, plan::Bound::untracked). Then tensors of
    // 17 to 127 elements, fused on CPU adapters and tracked there for L2,
    // Inf and p = 3 (the fused variant of that pipeline). With one tensor
    // of zeros after them, of a chunk and five elements, the set has a
    // chunk of one segment and takes the whole reduce_tensors. Each
    // tensor's norm, factor and clipped gradient must have the same bits
    // in both, the global norm the same bits with per-tensor results as
    // without, and match float64. Some tensors clip, and extreme elements
    // (an inf, a NaN, squares that overflow or underflow f32, subnormals,
    // zeros) take the paths the fast ones decline.
    let lengths = |lo: usize, span: usize| {
        let mut sizes = Vec::new();
        let mut left = 3 * 32768;
        while left > 0 {
            let n = (lo + (sizes.len() * 7919) % span).min(left);
            let n = if left - n < lo { left } else { n };
            sizes.push(n);
            left -= n;
        }
        sizes
    };
    for (sizes, seed) in [(lengths(129, 1919), 31), (lengths(17, 111), 37)] {
        let n: usize = sizes.iter().sum();
        let starts = starts_of(&sizes);
        let mut data = values(n, seed);
        for x in &mut data[starts[9]..starts[10]] {
            *x *= 1e30;
        }
        for x in &mut data[starts[13]..starts[14]] {
            *x *= 1e-30;
        }
        data[starts[20]..starts[21]].fill(0.0);
        for (k, x) in [0.0, f32::from_bits(3), -1e-39, 3e19].iter().enumerate() {
            for at in (k * 997..n).step_by(7001) {
                data[at] = *x;
            }
        }
        let mut beside_sizes = sizes.clone();
        beside_sizes.push(32773);
        for (inf, nan) in [(None, None), (Some(starts[5] + 3), Some(starts[30] + 1))] {
            let mut data = data.clone();
            for (k, x) in [(inf, f32::INFINITY), (nan, f32::NAN)] {
                if let Some(k) = k {
                    data[k] = x;
                }
            }
            let mut beside = data.clone();
            beside.resize(n + 32773, 0.0);
            for (tensorflow, order, max_norm) in [
                (false, Order::L2, 1.0f32),
                (true, Order::L2, 1.0),
                (false, Order::Inf, 5.0),
                (false, Order::P(3.0), 2.0),
                (true, Order::P(1.5), 3.0),
            ] {
                let base = framework_clip(tensorflow, max_norm).norm(order.to_norm());
                let clip = base.per_tensor(true);
                let what = format!(
                    "{order:?} tf={tensorflow} tensors of {}.. inf={inf:?}",
                    sizes[0]
                );
                let (alone, alone_after) =
                    run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
                let alone = alone.unwrap();
                let (with, with_after) =
                    run_clip(&beside, &beside_sizes, |set, enc| set.clip_norm(enc, &clip));
                let with = with.unwrap();
                let (plain, _) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &base));
                assert_eq!(
                    alone.partial.to_bytes(),
                    plain.unwrap().partial.to_bytes(),
                    "{what}: the global partial with per-tensor results and without"
                );
                for t in 0..sizes.len() {
                    assert_eq!(
                        tensor_result_bits(&alone, t),
                        tensor_result_bits(&with, t),
                        "{what}: tensor {t} alone and beside an untracked chunk"
                    );
                }
                assert_identical(&alone_after, &with_after[..n], &format!("{what}: clipped"));
                reference::assert_tensor_norms(
                    &alone.tensor_norms,
                    &data,
                    &sizes,
                    order,
                    1e-5,
                    &what,
                );
                if inf.is_none() {
                    let (_, want) =
                        per_tensor_reference(&data, &sizes, order, max_norm, tensorflow);
                    assert_close(&alone_after, &want, 1e-5, &what);
                    let clipped = alone
                        .tensor_coefficients
                        .iter()
                        .filter(|&&f| f < 1.0)
                        .count();
                    assert!(
                        clipped > 0 && clipped < sizes.len(),
                        "{what}: {clipped} of {} tensors clip",
                        sizes.len()
                    );
                }
            }
        }
    }
    assert_no_wgpu_errors();
}

#[test]
fn per_tensor_no_clip_step_scales_nothing() {
    let data = values(SIZES.iter().sum(), 3);
    let clip = ClipNorm::new(1e30).per_tensor(true);
    let g = gpu();
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&SIZES).unwrap())
        .unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &clip).unwrap();
    g.queue.submit([encoder.finish()]);
    let state = download(
        &g.device,
        &g.queue,
        set.stats_buffer(),
        std::mem::size_of::<gradclip::records::ClipState>() / 4,
    );
    let state: gradclip::records::ClipState =
        bytemuck::pod_read_unaligned(bytemuck::cast_slice(&state));
    assert_eq!(state.dispatch[0], 0);
    assert_no_wgpu_errors();
}

/// One shard: where it lives, its gradients and its tensor sizes.
type Shard<'a> = (
    &'a wgpu::Device,
    &'a wgpu::Queue,
    &'a gradclip::Clipper,
    Vec<f32>,
    Vec<usize>,
);

/// Records the norm of each shard, combines the partials on the CPU, and
/// clips every shard with the combined one. Returns the shards' gradients
/// afterwards and the report of the first shard.
fn clip_sharded(shards: &[Shard<'_>], clip: &ClipNorm) -> (Vec<Vec<f32>>, gradclip::ClipReport) {
    let mut sets = Vec::new();
    let mut partials = Vec::new();
    for (device, queue, clipper, data, sizes) in shards {
        let buffer = upload(device, data);
        let set = clipper
            .bind(&buffer, &GradLayout::from_sizes(sizes).unwrap())
            .unwrap();
        let mut encoder = device.create_command_encoder(&Default::default());
        set.record_norm(&mut encoder, clip).unwrap();
        queue.submit([encoder.finish()]);
        partials.push(pollster::block_on(set.read_report()).unwrap().partial);
        sets.push((buffer, set));
    }
    // The all-reduce: a CPU combine of 16-byte partials.
    let combined = NormPartial::combine(&partials, clip.norm_order()).unwrap();
    let bytes = combined.to_bytes();
    let roundtrip = NormPartial::from_bytes(bytes);
    assert_eq!(roundtrip, Ok(combined));
    let mut out = Vec::new();
    let mut first = None;
    for (rank, ((device, queue, _, data, _), (buffer, set))) in shards.iter().zip(&sets).enumerate()
    {
        let mut encoder = device.create_command_encoder(&Default::default());
        // Even ranks record the host value, odd ones copy it from a buffer.
        if rank % 2 == 0 {
            set.clip_with_partial(&mut encoder, clip, &combined)
                .unwrap();
        } else {
            let source = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("combined partial"),
                contents: &bytes,
                usage: wgpu::BufferUsages::COPY_SRC,
            });
            set.clip_with_partial_from(&mut encoder, clip, &source, 0)
                .unwrap();
        }
        queue.submit([encoder.finish()]);
        let report = pollster::block_on(set.read_report()).unwrap();
        first.get_or_insert(report);
        out.push(download(device, queue, buffer, data.len()));
    }
    (out, first.unwrap())
}

#[test]
fn sharded_norm_and_clip_equals_clipping_the_whole() {
    let g = gpu();
    let sizes: Vec<usize> = (0..24).map(|i| [5000, 0, 130, 40_000][i % 4]).collect();
    let data = values(sizes.iter().sum(), 4);
    for order in [Order::L2, Order::Inf, Order::P(1.0), Order::P(2.5)] {
        for (shard_count, tensorflow) in [(2, false), (3, true), (4, false)] {
            let base = framework_clip(tensorflow, 5.0);
            let clip = base.norm(order.to_norm());
            let (whole_report, whole) =
                run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
            let whole_report = whole_report.unwrap();
            // Cut the model into consecutive groups of tensors.
            let per = sizes.len().div_ceil(shard_count);
            let mut at = 0;
            let shards: Vec<_> = sizes
                .chunks(per)
                .map(|group| {
                    let n: usize = group.iter().sum();
                    at += n;
                    (
                        &g.device,
                        &g.queue,
                        &g.clipper,
                        data[at - n..at].to_vec(),
                        group.to_vec(),
                    )
                })
                .collect();
            let (parts, report) = clip_sharded(&shards, &clip);
            let what = format!("{order:?}, {shard_count} shards, tf={tensorflow}");
            assert!(
                rel_diff(report.total_norm as f64, whole_report.total_norm as f64) <= 1e-6,
                "{what}: norm"
            );
            assert_close(&parts.concat(), &whole, 1e-6, &what);
        }
    }
}

#[test]
fn sharded_over_two_devices() {
    // Two logical devices on the one adapter stand in for two GPUs.
    let g = gpu();
    let (device2, queue2, _) = pollster::block_on(gradclip::default_device()).unwrap();
    watch_errors(&device2);
    let clipper2 = gradclip::Clipper::new(&device2, &queue2).unwrap();
    let sizes = [30_000, 17, 50_000, 3];
    let data = values(sizes.iter().sum(), 5);
    let clip = ClipNorm::new(1.0).error_if_nonfinite(true);
    let (whole_report, whole) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
    let shards = [
        (
            &g.device,
            &g.queue,
            &g.clipper,
            data[..30_017].to_vec(),
            vec![30_000, 17],
        ),
        (
            &device2,
            &queue2,
            &clipper2,
            data[30_017..].to_vec(),
            vec![50_000, 3],
        ),
    ];
    let (parts, report) = clip_sharded(&shards, &clip);
    assert!(
        rel_diff(
            report.total_norm as f64,
            whole_report.unwrap().total_norm as f64
        ) <= 1e-6
    );
    assert_close(&parts.concat(), &whole, 1e-6, "two devices");
    assert_no_wgpu_errors();
}

#[test]
fn a_nonfinite_shard_poisons_the_combined_norm() {
    let g = gpu();
    let mut right = values(1000, 6);
    right[10] = f32::NAN;
    let shards = [
        (&g.device, &g.queue, &g.clipper, values(1000, 7), vec![1000]),
        (&g.device, &g.queue, &g.clipper, right, vec![1000]),
    ];
    let (parts, report) = clip_sharded(&shards, &ClipNorm::new(1.0));
    assert!(report.total_norm.is_nan() && report.nonfinite);
    assert!(
        parts.concat().iter().all(|g| g.is_nan()),
        "PyTorch: a NaN norm makes every gradient NaN"
    );
}

#[test]
fn gpu_partial_is_what_the_report_says() {
    let g = gpu();
    let data = values(10_000, 8);
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[10_000]).unwrap())
        .unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.record_norm(&mut encoder, &ClipNorm::new(1.0).norm(Norm::P(3.0)))
        .unwrap();
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();
    let words = download(
        &g.device,
        &g.queue,
        set.stats_buffer(),
        (set.partial_offset() / 4) as usize + 4,
    );
    let offset = (set.partial_offset() / 4) as usize;
    let bytes: [u8; 16] = bytemuck::cast_slice(&words[offset..offset + 4])
        .try_into()
        .unwrap();
    assert_eq!(NormPartial::from_bytes(bytes), Ok(report.partial));
    let cpu = report.partial.total_norm(Norm::P(3.0)).unwrap();
    assert!(rel_diff(cpu, reference::norm(&data, Order::P(3.0))) <= 1e-5);
    assert_identical(
        &download(&g.device, &g.queue, &buffer, data.len()),
        &data,
        "record_norm touches nothing",
    );
}

/// The sizes of a 20-tensor model and where each tensor goes: (buffer, byte offset).
fn scattered() -> (Vec<usize>, Vec<(usize, u64)>) {
    let sizes: Vec<usize> = (0..20).map(|i| [1000, 37, 0, 70_001, 5][i % 5]).collect();
    let mut cursor = [256u64, 4, 1024];
    let placement = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let b = (i * 7) % 3;
            let at = cursor[b];
            cursor[b] += 4 * n as u64 + 4 * (i as u64 % 3) + 8; // gaps of other data between tensors
            (b, at)
        })
        .collect();
    (sizes, placement)
}

fn clip_scattered(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    clipper: &gradclip::Clipper,
    clip: &ClipNorm,
) {
    let (sizes, placement) = scattered();
    let data = values(sizes.iter().sum(), 9);
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    // Buffers full of a sentinel that must survive everywhere outside the tensors.
    let sentinel = -7.25f32;
    let mut hosts: Vec<Vec<f32>> = (0..3).map(|b| vec![sentinel; 400_000 + 1000 * b]).collect();
    let mut at = 0;
    for (&n, &(b, offset)) in sizes.iter().zip(&placement) {
        let o = offset as usize / 4;
        hosts[b][o..o + n].copy_from_slice(&data[at..at + n]);
        at += n;
    }
    let buffers: Vec<wgpu::Buffer> = hosts.iter().map(|h| upload(device, h)).collect();
    let ranges: Vec<wgpu::BufferBinding> = sizes
        .iter()
        .zip(&placement)
        .map(|(&n, &(b, offset))| wgpu::BufferBinding {
            buffer: &buffers[b],
            offset,
            size: wgpu::BufferSize::new(4 * n as u64),
        })
        .collect();
    let set = clipper.bind_ranges(&layout, &ranges).unwrap();
    let mut encoder = device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, clip).unwrap();
    queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();

    let (flat_report, flat) = run_clip(&data, &sizes, |s, enc| s.clip_norm(enc, clip));
    let flat_report = flat_report.unwrap();
    assert!(
        rel_diff(report.total_norm as f64, flat_report.total_norm as f64) <= 1e-6,
        "{report:?}"
    );
    let mut want_hosts = hosts.clone();
    let mut at = 0;
    for (&n, &(b, offset)) in sizes.iter().zip(&placement) {
        let o = offset as usize / 4;
        want_hosts[b][o..o + n].copy_from_slice(&flat[at..at + n]);
        at += n;
    }
    for (b, buffer) in buffers.iter().enumerate() {
        let got = download(device, queue, buffer, hosts[b].len());
        // Sentinels exactly, tensors as the flat clip within rounding.
        for (j, (&x, &w)) in got.iter().zip(&want_hosts[b]).enumerate() {
            if hosts[b][j].to_bits() == sentinel.to_bits() && w.to_bits() == sentinel.to_bits() {
                assert_eq!(
                    x.to_bits(),
                    w.to_bits(),
                    "buffer {b} element {j}: outside data was touched"
                );
            }
        }
        assert_close(&got, &want_hosts[b], 1e-6, &format!("buffer {b}"));
    }
    hosts.clear();
}

#[test]
fn tensors_over_three_buffers_equal_one_flat_buffer() {
    let g = gpu();
    for clip in [
        ClipNorm::new(3.0),
        ClipNorm::new(3.0).per_tensor(true),
        ClipNorm::new(1.0).norm(Norm::Inf),
    ] {
        clip_scattered(&g.device, &g.queue, &g.clipper, &clip);
    }
    assert_no_wgpu_errors();
}

#[test]
fn scattered_set_larger_than_the_binding_limit() {
    // A device that binds at most 64 KiB: every buffer needs several windows.
    let (device, queue, clipper) = common::device_with_binding_limit(64 << 10);
    clip_scattered(&device, &queue, &clipper, &ClipNorm::new(3.0));
    assert_no_wgpu_errors();
}

#[test]
fn per_tensor_norms_over_many_windows_match_float64() {
    // A device that binds at most 64 KiB: 300 adjacent tensors of 200 to
    // 299 elements, then 1500 of 16 to 31, span several windows, whose
    // flat chunks hold many segments each, which the reduce pass folds
    // during its flat walk in rounds sized from each chunk's gap word
    // (long rounds in the first windows, one-step rounds in the last: a
    // gap read from the wrong chunk would give a round two segment ends).
    let (device, queue, clipper) = common::device_with_binding_limit(64 << 10);
    let sizes: Vec<usize> = (0..1800)
        .map(|i| {
            if i < 300 {
                200 + (i * 7919) % 100
            } else {
                16 + (i * 7919) % 16
            }
        })
        .collect();
    let data = values(sizes.iter().sum(), 11);
    let buffer = upload(&device, &data);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&sizes).unwrap())
        .unwrap();
    for order in [Order::L2, Order::Inf] {
        let clip = ClipNorm::new(f32::MAX).norm(order.to_norm());
        let mut reports = Vec::new();
        for clip in [clip, clip.tensor_norms(true)] {
            let mut encoder = device.create_command_encoder(&Default::default());
            set.clip_norm(&mut encoder, &clip).unwrap();
            queue.submit([encoder.finish()]);
            reports.push(pollster::block_on(set.read_report()).unwrap());
        }
        assert!(set.window_count() >= 5, "{} windows", set.window_count());
        let what = format!("{order:?} over {} windows", set.window_count());
        assert_eq!(
            reports[0].total_norm.to_bits(),
            reports[1].total_norm.to_bits(),
            "{what}: tensor_norms moved the global norm"
        );
        let want = reference::norm(&data, order);
        assert!(
            rel_diff(reports[1].total_norm as f64, want) <= 1e-5,
            "{what}"
        );
        reference::assert_tensor_norms(&reports[1].tensor_norms, &data, &sizes, order, 1e-5, &what);
    }
    assert_no_wgpu_errors();
}

#[test]
fn bad_ranges_are_errors() {
    let g = gpu();
    let buffer = upload(&g.device, &values(1000, 10));
    let layout = GradLayout::from_sizes(&[100, 100]).unwrap();
    let range = |offset, n: u64| wgpu::BufferBinding {
        buffer: &buffer,
        offset,
        size: wgpu::BufferSize::new(4 * n),
    };
    use gradclip::Error;
    assert_eq!(
        g.clipper
            .bind_ranges(&layout, &[range(0, 100), range(396, 100)])
            .unwrap_err(),
        Error::OverlappingTensors {
            first: 0,
            second: 1
        }
    );
    assert!(matches!(
        g.clipper
            .bind_ranges(&layout, &[range(0, 100), range(402, 100)]),
        Err(Error::MisalignedTensor { tensor: 1, .. })
    ));
    assert!(matches!(
        g.clipper
            .bind_ranges(&layout, &[range(0, 100), range(400, 99)]),
        Err(Error::RangeMismatch { tensor: 1, .. })
    ));
    assert!(matches!(
        g.clipper.bind_ranges(&layout, &[range(0, 100)]),
        Err(Error::RangeMismatch { .. })
    ));
    assert!(g
        .clipper
        .bind_ranges(&layout, &[range(3200, 100), range(0, 100)])
        .is_ok());
    let set = g.clipper.bind(&buffer, &layout).unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    let not_copy_src = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: GRAD_USAGE - wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    assert!(matches!(
        set.clip_with_partial_from(&mut encoder, &ClipNorm::new(1.0), &not_copy_src, 0),
        Err(Error::MissingUsage { .. })
    ));
    assert!(matches!(
        set.clip_with_partial_from(
            &mut encoder,
            &ClipNorm::new(1.0).per_tensor(true),
            &buffer,
            0
        ),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        set.clip_with_partial_from(&mut encoder, &ClipNorm::new(1.0), &buffer, 3996),
        Err(Error::LayoutExceedsBuffer { .. })
    ));
    drop(encoder);
    assert_no_wgpu_errors();
}

#[test]
fn ten_steps_before_reading_give_ten_ordered_reports() {
    let g = gpu();
    let data = values(50_000, 11);
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[20_000, 30_000]).unwrap())
        .unwrap();
    let mut host = data.clone();
    let mut want = Vec::new();
    for step in 0..10 {
        // A different threshold each step, so that every norm differs.
        let norm = reference::norm(&host, Order::L2);
        let max_norm = norm * (0.5 + 0.04 * step as f64);
        want.push(norm);
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(max_norm as f32))
            .unwrap();
        g.queue.submit([encoder.finish()]);
        host = reference::torch_clipped(&host, norm, max_norm as f32 as f64);
    }
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!(taken.dropped, 0);
    let reports = taken.reports;
    assert_eq!(
        reports.iter().map(|r| r.step).collect::<Vec<_>>(),
        (1..=10).collect::<Vec<u64>>()
    );
    for (report, want) in reports.iter().zip(&want) {
        assert!(
            rel_diff(report.total_norm as f64, *want) <= 1e-5,
            "step {}: {} vs {want}",
            report.step,
            report.total_norm
        );
    }
    assert!(
        pollster::block_on(set.take_reports())
            .unwrap()
            .reports
            .is_empty(),
        "taken once"
    );
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 10);
    assert_no_wgpu_errors();
}

#[test]
fn integer_order_partials_are_valid_whatever_the_sum() {
    // An integer p's share sums are kept relative to a power of two at or
    // below the norm (no largest element tracked): the partial must still
    // be one NormPartial accepts (s >= 1, m in [1, 2)) and give the norm,
    // for sums whose exponents are negative or positive and no multiple
    // of p.
    for p in 1..=8u32 {
        for scale in [3e-4f32, 0.7, 9.0] {
            let data: Vec<f32> = (0..5_000)
                .map(|i| {
                    scale * (1.0 + (i % 17) as f32 / 17.0) * if i % 2 == 0 { 1.0 } else { -1.0 }
                })
                .collect();
            let norm = Norm::P(p as f32);
            let (report, _) = run_clip(&data, &[1_000, 4_000], |set, enc| {
                set.record_norm(enc, &ClipNorm::new(1.0).norm(norm))
            });
            let report = report.unwrap();
            let what = format!("p = {p}, scale {scale}");
            assert_eq!(
                NormPartial::from_bytes(report.partial.to_bytes()),
                Ok(report.partial),
                "{what}"
            );
            assert!(report.partial.check(norm).is_ok(), "{what}");
            let want = reference::norm(&data, Order::P(p as f64));
            let cpu = report.partial.total_norm(norm).unwrap();
            assert!(rel_diff(cpu, want) <= 1e-5, "{what}: {cpu} against {want}");
            assert!(rel_diff(report.total_norm as f64, want) <= 1e-5, "{what}");
        }
    }
    assert_no_wgpu_errors();
}
