//! The fused optimizer path: `record_norm` + an SGD step that multiplies by
//! the coefficient on load equals `clip_norm` + a plain step, bit for bit,
//! including non-finite norms; with `error_if_nonfinite` the step is skipped.

use crate::common;

#[path = "../../examples/fused_sgd/sgd.rs"]
mod sgd;

use common::reference::assert_identical;
use common::{assert_no_wgpu_errors, download, gpu, upload};
use gradclip::{ClipNorm, GradLayout, Norm};
use sgd::{FusedSgd, SgdBuffers, APPLY_COEFFICIENT, SKIP_NONFINITE};

struct Model {
    params: wgpu::Buffer,
    grads: wgpu::Buffer,
    set: gradclip::GradSet,
    sgd: FusedSgd,
}

fn model(params: &[f32], grads: &[f32], sizes: &[usize], flags: u32) -> Model {
    let g = gpu();
    let params = upload(&g.device, params);
    let grads = upload(&g.device, grads);
    let velocity = upload(&g.device, &vec![0.0; sizes.iter().sum()]);
    let set = g
        .clipper
        .bind(&grads, &GradLayout::from_sizes(sizes).unwrap())
        .unwrap();
    let buffers = SgdBuffers {
        params: &params,
        grads: &grads,
        velocity: &velocity,
        clip: set.coefficient_binding(),
    };
    let sgd = FusedSgd::new(
        &g.device,
        buffers,
        sizes.iter().sum::<usize>() as u32,
        0.05,
        0.9,
        flags,
    );
    Model {
        params,
        grads,
        set,
        sgd,
    }
}

/// Two models on the same parameters and step-0 gradients, both skipping
/// non-finite steps: `fused` multiplies by the coefficient on load, `plain`
/// steps on gradients clipped in place.
fn skipping_pair(params: &[f32], sizes: &[usize]) -> (Model, Model) {
    let grads = gradients(params.len(), 0);
    (
        model(params, &grads, sizes, APPLY_COEFFICIENT | SKIP_NONFINITE),
        model(params, &grads, sizes, SKIP_NONFINITE),
    )
}

fn gradients(n: usize, step: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 31 + step * 17) % 97) as f32 - 48.0) * 0.02 * (step + 1) as f32)
        .collect()
}

/// One training step of both models on the same `grads`: `fused` records
/// the norm and steps with the coefficient applied on load, `plain` clips in
/// place and steps plainly.
fn step_both(fused: &Model, plain: &Model, grads: &[f32], clip: &ClipNorm) {
    step_both_with(
        fused,
        plain,
        grads,
        |encoder| fused.set.record_norm(encoder, clip).unwrap(),
        |encoder| plain.set.clip_norm(encoder, clip).unwrap(),
    );
}

/// [`step_both`] with the norm recordings given: `record_fused` leaves the
/// gradients to the fused step, `record_plain` clips them.
fn step_both_with(
    fused: &Model,
    plain: &Model,
    grads: &[f32],
    record_fused: impl FnOnce(&mut wgpu::CommandEncoder),
    record_plain: impl FnOnce(&mut wgpu::CommandEncoder),
) {
    let g = gpu();
    g.queue
        .write_buffer(&fused.grads, 0, bytemuck::cast_slice(grads));
    g.queue
        .write_buffer(&plain.grads, 0, bytemuck::cast_slice(grads));
    let mut encoder = g.device.create_command_encoder(&Default::default());
    record_fused(&mut encoder);
    fused.sgd.encode(&mut encoder);
    record_plain(&mut encoder);
    plain.sgd.encode(&mut encoder);
    g.queue.submit([encoder.finish()]);
}

#[test]
fn fused_step_equals_clip_then_step() {
    let g = gpu();
    let sizes = [40_000, 3, 0, 12_345];
    let n: usize = sizes.iter().sum();
    let params: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.1).collect();
    for clip in [
        ClipNorm::new(1.0),
        ClipNorm::tensorflow(2.0).norm(Norm::Inf),
        ClipNorm::new(1e9),
    ] {
        let fused = model(&params, &gradients(n, 0), &sizes, APPLY_COEFFICIENT);
        let plain = model(&params, &gradients(n, 0), &sizes, 0);
        for step in 0..3 {
            step_both(&fused, &plain, &gradients(n, step), &clip);
        }
        let a = download(&g.device, &g.queue, &fused.params, n);
        let b = download(&g.device, &g.queue, &plain.params, n);
        assert_identical(
            &a,
            &b,
            &format!("{clip:?}: fused vs clip-then-step after 3 steps"),
        );
        let report = pollster::block_on(fused.set.read_report()).unwrap();
        assert_eq!(report.step, 3);
    }
    assert_no_wgpu_errors();
}

#[test]
fn fused_step_propagates_nonfinite_norms_like_pytorch() {
    let g = gpu();
    let n = 1000;
    let params = vec![1.0f32; n];
    let mut grads = gradients(n, 0);
    grads[7] = f32::INFINITY;
    let fused = model(&params, &grads, &[n], APPLY_COEFFICIENT);
    let plain = model(&params, &grads, &[n], 0);
    step_both(&fused, &plain, &grads, &ClipNorm::new(1.0));
    let a = download(&g.device, &g.queue, &fused.params, n);
    assert_identical(
        &a,
        &download(&g.device, &g.queue, &plain.params, n),
        "inf norm",
    );
    assert!(
        a[7].is_nan() && a[0] == 1.0,
        "coefficient 0: finite gradients vanish, the inf one is NaN"
    );
    assert_no_wgpu_errors();
}

#[test]
fn error_if_nonfinite_skips_the_fused_step() {
    let g = gpu();
    let n = 1000;
    let params: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut grads = gradients(n, 1);
    grads[500] = f32::NAN;
    let fused = model(&params, &grads, &[n], APPLY_COEFFICIENT | SKIP_NONFINITE);
    let mut encoder = g.device.create_command_encoder(&Default::default());
    fused
        .set
        .record_norm(&mut encoder, &ClipNorm::new(1.0).error_if_nonfinite(true))
        .unwrap();
    fused.sgd.encode(&mut encoder);
    g.queue.submit([encoder.finish()]);
    assert!(matches!(
        pollster::block_on(fused.set.read_report()),
        Err(gradclip::Error::NonFinite { .. })
    ));
    assert_identical(
        &download(&g.device, &g.queue, &fused.params, n),
        &params,
        "skipped step",
    );
    assert_identical(
        &download(&g.device, &g.queue, &fused.grads, n),
        &grads,
        "gradients untouched",
    );
    assert_no_wgpu_errors();
}

#[test]
fn fused_amp_step_equals_unscaling_clip_then_step() {
    // GradScaler in the optimizer: record_norm(unscale) + an SGD step that
    // multiplies by coefficient (= clip / S) on load and skips on a
    // non-finite step, against clip_norm(unscale) + a plain step.
    let g = gpu();
    let sizes = [20_000, 7, 5_000];
    let n: usize = sizes.iter().sum();
    let params: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.1).collect();
    let clip = ClipNorm::new(1.0).unscale(true);
    let scaler = gradclip::LossScaler::new()
        .init_scale(1024.0)
        .growth_interval(2);
    let (fused, plain) = skipping_pair(&params, &sizes);
    fused.set.set_loss_scaler(&scaler).unwrap();
    plain.set.set_loss_scaler(&scaler).unwrap();
    for step in 0..6 {
        let mut grads: Vec<f32> = gradients(n, step).iter().map(|x| x * 1024.0).collect();
        if step == 3 {
            grads[n - 1] = f32::INFINITY;
        }
        step_both(&fused, &plain, &grads, &clip);
    }
    assert_identical(
        &download(&g.device, &g.queue, &fused.params, n),
        &download(&g.device, &g.queue, &plain.params, n),
        "fused vs unscaling clip-then-step after 6 steps",
    );
    let reports = [&fused, &plain].map(|m| pollster::block_on(m.set.take_reports()).unwrap());
    let scales: Vec<Vec<(f32, bool)>> = reports
        .iter()
        .map(|r| {
            r.reports
                .iter()
                .map(|r| (r.loss_scale, r.found_inf))
                .collect()
        })
        .collect();
    // Grows after steps 1 (2 finite), backs off at 3, grows after 5.
    let want = [
        (1024.0, false),
        (2048.0, false),
        (2048.0, false),
        (1024.0, true),
        (1024.0, false),
        (2048.0, false),
    ];
    assert_eq!(scales[0], want);
    assert_eq!(scales[1], want);
    assert_no_wgpu_errors();
}

/// ZClip and AutoClip with the coefficient applied in the optimizer:
/// `AdaptiveClip::record_norm` + an SGD step that multiplies on load equals
/// `AdaptiveClip::clip` + a plain step, bit for bit, over 30 steps with
/// spikes (some steps clip, most do not) and a NaN step that both skip, with
/// and without loss scaling; both report the same thresholds and
/// coefficients, and the fused model's gradients are never written.
#[test]
fn fused_step_after_an_adaptive_threshold_equals_adaptive_clip_then_step() {
    let g = gpu();
    let sizes = [5_000, 17, 3_000];
    let n: usize = sizes.iter().sum();
    let params: Vec<f32> = (0..n).map(|i| (i % 11) as f32 * 0.1).collect();
    let methods: [gradclip::AdaptiveMethod; 2] = [
        gradclip::ZClip::new().warmup_steps(5).into(),
        gradclip::AutoClip::new(50.0).into(),
    ];
    for (method, unscale) in methods.iter().flat_map(|&m| [(m, false), (m, true)]) {
        let (fused, plain) = skipping_pair(&params, &sizes);
        let fused_clip = gradclip::AdaptiveClip::new(&fused.set, method).unwrap();
        let plain_clip = gradclip::AdaptiveClip::new(&plain.set, method).unwrap();
        let clip = ClipNorm::new(1.0).unscale(unscale);
        // Loss scaling: gradients arrive multiplied by the scale (1024, then
        // halved by the overflowed step), and the coefficient divides it out.
        let scaler = gradclip::LossScaler::new().init_scale(1024.0);
        if unscale {
            fused.set.set_loss_scaler(&scaler).unwrap();
            plain.set.set_loss_scaler(&scaler).unwrap();
        }
        let mut loss_scale = if unscale { 1024.0 } else { 1.0 };
        let mut last = Vec::new();
        for step in 0..30 {
            let mut grads = gradients(n, step % 4);
            if step % 7 == 6 {
                grads.iter_mut().for_each(|x| *x *= 40.0);
            }
            grads.iter_mut().for_each(|x| *x *= loss_scale);
            if step == 20 {
                grads[4_000] = f32::NAN;
                loss_scale /= 2.0;
            }
            step_both_with(
                &fused,
                &plain,
                &grads,
                |encoder| fused_clip.record_norm(&fused.set, encoder, &clip).unwrap(),
                |encoder| plain_clip.clip(&plain.set, encoder, &clip).unwrap(),
            );
            last = grads;
        }
        let what = format!("{method:?}, unscale {unscale}");
        assert_identical(
            &download(&g.device, &g.queue, &fused.params, n),
            &download(&g.device, &g.queue, &plain.params, n),
            &format!("{what}: fused vs adaptive clip-then-step after 30 steps"),
        );
        assert_identical(
            &download(&g.device, &g.queue, &fused.grads, n),
            &last,
            &format!("{what}: the fused model's gradients are left alone"),
        );
        let [fused_log, plain_log] =
            [&fused, &plain].map(|m| pollster::block_on(m.set.take_reports()).unwrap().reports);
        assert_eq!(fused_log.len(), 30, "{what}: one report per step");
        let pairs = |log: &[gradclip::ClipReport]| -> Vec<(u32, u32, u32)> {
            log.iter()
                .map(|r| {
                    (
                        r.total_norm.to_bits(),
                        r.max_norm.to_bits(),
                        r.coefficient.to_bits(),
                    )
                })
                .collect()
        };
        assert_eq!(pairs(&fused_log), pairs(&plain_log), "{what}: reports");
        let clipped = fused_log
            .iter()
            .filter(|r| r.coefficient * r.unscaled_by < 0.9)
            .count();
        assert!(
            (2..25).contains(&clipped),
            "{what}: {clipped} of 30 steps clipped"
        );
        assert!(
            fused_log[20].total_norm.is_nan() || fused_log[20].found_inf,
            "{what}: the NaN step"
        );
        if unscale {
            assert_eq!(fused_log[21].loss_scale, 512.0, "{what}: scale backed off");
        }
    }
    assert_no_wgpu_errors();
}
