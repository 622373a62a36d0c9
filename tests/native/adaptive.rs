//! ZClip and AutoClip on the GPU against the float64 references of
//! `tests/common/adaptive_reference.rs`, run side by side for 500 steps of
//! the synthetic norm sequence (spikes, a slow drift, a NaN step): every
//! step's threshold, decision, coefficient and clipped gradients.

use crate::common;

use common::adaptive_reference::{self as reference, Rng, StepOut};
use common::{assert_no_wgpu_errors, download, gpu, upload};
use gradclip::{
    AdaptiveClip, AdaptiveDecision, AdaptiveMethod, ClipNorm, GradLayout, GradType, Semantics,
};

/// Tensor sizes of the test set (two tensors, so the flat walk crosses one).
const SIZES: [usize; 2] = [700, 324];
/// Relative tolerance of thresholds, coefficients and clipped gradients.
const TOL: f64 = 1e-5;
/// Relative distance from a decision's boundary below which f32 and f64 may
/// decide differently.
const EDGE: f64 = 1e-5;

fn rel(got: f64, want: f64) -> f64 {
    if got == want {
        return 0.0;
    }
    (got - want).abs() / want.abs().max(f64::MIN_POSITIVE)
}

fn same(got: f64, want: f64, tol: f64) -> bool {
    (got.is_nan() && want.is_nan()) || rel(got, want) <= tol
}

/// Tests of this file take turns on the shared device: the set's
/// `read_report` natively waits for its submission and then expects its map
/// callback to have run, which a `poll` running at the same time on another
/// thread (another test's read) can still be delivering.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// One GPU step: what the adaptive pass and the set reported.
#[derive(Clone, Copy, Debug, PartialEq)]
struct GpuStep {
    decision: AdaptiveDecision,
    coefficient: f32,
    total_norm: f32,
}

impl GpuStep {
    fn bits(&self) -> [u32; 6] {
        let d = &self.decision;
        [
            d.norm.to_bits(),
            d.threshold.to_bits(),
            d.boundary.to_bits(),
            self.coefficient.to_bits(),
            self.total_norm.to_bits(),
            d.clipped as u32 | (d.spike as u32) << 1 | (d.skipped as u32) << 2,
        ]
    }
}

/// A set over freshly uploaded gradients with an adaptive clip on it.
struct Run {
    buffer: wgpu::Buffer,
    set: gradclip::GradSet,
    adaptive: AdaptiveClip,
    clip: ClipNorm,
}

impl Run {
    fn new(method: AdaptiveMethod, semantics: Semantics) -> Self {
        Self::with_sizes(method, semantics, &SIZES)
    }

    fn with_sizes(method: AdaptiveMethod, semantics: Semantics, sizes: &[usize]) -> Self {
        let g = gpu();
        let len: usize = sizes.iter().sum();
        let buffer = upload(&g.device, &vec![0.0; len]);
        let layout = GradLayout::from_sizes(sizes).unwrap();
        let set = g.clipper.bind(&buffer, &layout).unwrap();
        let adaptive = AdaptiveClip::new(&set, method).unwrap();
        let clip = match semantics {
            Semantics::Torch => ClipNorm::new(1.0),
            Semantics::TensorFlow => ClipNorm::tensorflow(1.0),
        };
        Self {
            buffer,
            set,
            adaptive,
            clip,
        }
    }

    /// Uploads `data`, records one adaptive step with `clip` (nothing is
    /// mapped or read while recording) and submits it.
    fn record(&self, data: &[f32], clip: &ClipNorm) {
        let g = gpu();
        g.queue
            .write_buffer(&self.buffer, 0, bytemuck::cast_slice(data));
        let mut encoder = g.device.create_command_encoder(&Default::default());
        self.adaptive.clip(&self.set, &mut encoder, clip).unwrap();
        g.queue.submit([encoder.finish()]);
    }

    /// [`record`](Self::record)s one adaptive step with the run's clip,
    /// then reads what it did.
    fn step(&self, data: &[f32]) -> (GpuStep, Vec<f32>) {
        let g = gpu();
        self.record(data, &self.clip);
        let decision = pollster::block_on(self.adaptive.read_decision()).unwrap();
        let report = pollster::block_on(self.set.read_report()).unwrap();
        if !matches!(self.adaptive.method(), AdaptiveMethod::AdaGc(_)) {
            // The clip's report carries the threshold it clipped to.
            let want = if decision.threshold.is_finite() {
                decision.threshold
            } else {
                f32::MAX
            };
            assert_eq!(report.max_norm, want, "{decision:?}");
            // ... and says whether it clipped, as the method decided.
            assert_eq!(
                report.clipped(),
                decision.clipped,
                "{decision:?} {report:?}"
            );
        }
        let after = download(&g.device, &g.queue, &self.buffer, data.len());
        assert_no_wgpu_errors();
        let step = GpuStep {
            decision,
            coefficient: report.coefficient,
            total_norm: report.total_norm,
        };
        (step, after)
    }
}

/// The float64 norm of the data (NaN or inf as the data makes it).
fn norm64(data: &[f32]) -> f64 {
    if data.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    data.iter()
        .map(|&x| x as f64 * x as f64)
        .sum::<f64>()
        .sqrt()
}

/// Runs the synthetic sequence through the GPU and `reference`, checking
/// every step; returns the GPU steps for bit-identity checks.
fn run_against(
    method: AdaptiveMethod,
    semantics: Semantics,
    mut reference: impl FnMut(f64) -> StepOut,
) -> Vec<GpuStep> {
    let run = Run::new(method, semantics);
    let targets = reference::synthetic_norms(reference::SYNTH_SEED);
    let mut rng = Rng::new(0x00ad_a971);
    let len: usize = SIZES.iter().sum();
    let mut steps = Vec::new();
    let (mut clipped, mut skipped, mut on_edge) = (0, 0, 0);
    for (t, &target) in targets.iter().enumerate() {
        let data = reference::gradients_with_norm(&mut rng, len, target);
        let norm = norm64(&data);
        let want = reference(norm);
        let (got, after) = run.step(&data);
        let d = &got.decision;
        let ctx = format!("step {t}: gpu {got:?}\nreference {want:?}");
        assert!(same(d.norm as f64, norm, 1e-6), "norm, {ctx}");
        assert_eq!(d.skipped, want.skipped, "skipped, {ctx}");
        // Decisions are compared off the knife's edge: f32 arithmetic moves
        // a boundary by ~1e-7 relative, so within EDGE of it either side is
        // right (AutoClip meets such steps: the norm is in its own window).
        // The threshold and the coefficient, continuous there, still are.
        if want.margin > EDGE {
            assert_eq!(d.clipped, want.clipped, "clipped, {ctx}");
            assert_eq!(d.spike, want.spike, "spike, {ctx}");
        } else {
            on_edge += 1;
        }
        assert!(
            same(d.threshold as f64, want.threshold, TOL),
            "threshold {} vs {} ({:e}), {ctx}",
            d.threshold,
            want.threshold,
            rel(d.threshold as f64, want.threshold)
        );
        assert!(
            same(d.boundary as f64, want.boundary, TOL),
            "boundary, {ctx}"
        );
        assert!(
            same(got.coefficient as f64, want.coefficient, TOL),
            "coefficient {} vs {}, {ctx}",
            got.coefficient,
            want.coefficient
        );
        for (i, (&before, &a)) in data.iter().zip(&after).enumerate() {
            let expect = before as f64 * want.coefficient;
            let ok = if expect.is_nan() {
                a.is_nan()
            } else {
                (a as f64 - expect).abs() <= TOL * expect.abs() + 1e-30
            };
            assert!(ok, "element {i} = {a}, want {expect}, {ctx}");
        }
        clipped += want.clipped as usize;
        skipped += want.skipped as usize;
        steps.push(got);
    }
    // The sequence exercised what it is for.
    assert!(clipped >= 3, "only {clipped} clipped steps");
    assert_eq!(skipped, 1);
    assert!(
        on_edge <= 5,
        "{on_edge} steps within {EDGE:e} of a boundary"
    );
    steps
}

fn zclip_reference(cfg: reference::ZClipConfig) -> impl FnMut(f64) -> StepOut {
    let mut z = reference::ZClip::new(cfg);
    move |g| z.step(g)
}

fn autoclip_reference(cfg: reference::AutoClipConfig) -> impl FnMut(f64) -> StepOut {
    let mut a = reference::AutoClip::new(cfg);
    move |g| a.step(g)
}

#[test]
fn zclip_defaults_follow_the_reference_and_repeat_bit_for_bit() {
    let _turn = serial();
    let method = gradclip::ZClip::new().into();
    let cfg = reference::ZClipConfig::default();
    let first = run_against(method, Semantics::Torch, zclip_reference(cfg));
    // Every spike of the sequence after warm-up is caught.
    for (t, _) in reference::SPIKES {
        assert!(first[t].decision.clipped, "spike at step {t} not clipped");
    }
    let second = run_against(method, Semantics::Torch, zclip_reference(cfg));
    let bits = |s: &[GpuStep]| s.iter().map(GpuStep::bits).collect::<Vec<_>>();
    assert_eq!(bits(&first), bits(&second), "two runs differ");
}

#[test]
fn zclip_to_the_mean_with_a_cap_and_no_update_on_spikes() {
    let _turn = serial();
    let method = gradclip::ZClip::new()
        .mode(gradclip::ZClipMode::ZScore(gradclip::ZClipTo::Mean))
        .max_norm(Some(3.0))
        .skip_update_on_spike(true)
        .warmup_steps(10)
        .into();
    let cfg = reference::ZClipConfig {
        mode: reference::ZMode::ZScore(reference::ZClipTo::Mean),
        max_norm: Some(3.0),
        skip_update_on_spike: true,
        warmup_steps: 10,
        ..Default::default()
    };
    run_against(method, Semantics::Torch, zclip_reference(cfg));
}

#[test]
fn zclip_percentile_mode_under_tensorflow_semantics() {
    let _turn = serial();
    let method = gradclip::ZClip::new()
        .mode(gradclip::ZClipMode::Percentile)
        .alpha(0.9)
        .z_thresh(3.0)
        .into();
    let cfg = reference::ZClipConfig {
        mode: reference::ZMode::Percentile,
        alpha: 0.9,
        z_thresh: 3.0,
        semantics: Semantics::TensorFlow,
        ..Default::default()
    };
    run_against(method, Semantics::TensorFlow, zclip_reference(cfg));
}

#[test]
fn autoclip_over_all_of_history_follows_the_paper() {
    let _turn = serial();
    // A window longer than the run is the paper's "all of history".
    let method = gradclip::AutoClip::new(10.0).window(512).into();
    let cfg = reference::AutoClipConfig::paper(10.0);
    let first = run_against(method, Semantics::Torch, autoclip_reference(cfg));
    let second = run_against(method, Semantics::Torch, autoclip_reference(cfg));
    let bits = |s: &[GpuStep]| s.iter().map(GpuStep::bits).collect::<Vec<_>>();
    assert_eq!(bits(&first), bits(&second), "two runs differ");
}

#[test]
fn autoclip_windowed_quantile_clip_under_tensorflow() {
    let _turn = serial();
    let method = gradclip::AutoClip::new(90.0)
        .window(50)
        .include_current(false)
        .into();
    let cfg = reference::AutoClipConfig {
        percentile: 90.0,
        window: Some(50),
        include_current: false,
        semantics: Semantics::TensorFlow,
    };
    run_against(method, Semantics::TensorFlow, autoclip_reference(cfg));
}

#[test]
fn autoclip_interpolates_between_order_statistics() {
    let _turn = serial();
    // p = 37 over 13-norm windows: h = 12 · 0.37 = 4.44, never an integer.
    let method = gradclip::AutoClip::new(37.0).window(13).into();
    let cfg = reference::AutoClipConfig {
        percentile: 37.0,
        window: Some(13),
        include_current: true,
        semantics: Semantics::Torch,
    };
    run_against(method, Semantics::Torch, autoclip_reference(cfg));
}

/// AutoClip over all of history in a histogram, over the 500-step sequence
/// (spikes, drift, a NaN step): every threshold equals numpy's percentile of
/// the GPU's own norms floored to their buckets (within 1e-5), lies at or
/// below the exact percentile by less than the documented 2^-m, and the
/// coefficient and gradients follow it; the state saves and restores, and
/// bucket counts that do not add up are rejected.
#[test]
fn autoclip_over_all_of_history_in_buckets_stays_within_its_bound() {
    let _turn = serial();
    for (m, p) in [(7u32, 10.0f64), (3, 50.0)] {
        let method: AdaptiveMethod = gradclip::AutoClip::new(p as f32).all_history(m).into();
        let run = Run::new(method, Semantics::Torch);
        let targets = reference::synthetic_norms(reference::SYNTH_SEED);
        let mut rng = Rng::new(0x0b0c_4e75);
        let len: usize = SIZES.iter().sum();
        // The norms as the GPU saw them (the buckets floor those f32s).
        let mut history: Vec<f64> = Vec::new();
        let (mut floored, mut skipped) = (0, 0);
        for (t, &target) in targets.iter().enumerate() {
            let data = reference::gradients_with_norm(&mut rng, len, target);
            let (got, after) = run.step(&data);
            let d = got.decision;
            let ctx = format!("m {m}, p {p}, step {t}: {got:?}");
            assert!(same(d.norm as f64, norm64(&data), 1e-6), "{ctx}");
            if d.norm.is_finite() {
                history.push(d.norm as f64);
            } else {
                assert!(d.skipped, "{ctx}");
                skipped += 1;
            }
            let want = reference::percentile_bucketed(&history, p, m);
            let exact = reference::percentile_linear(&history, p);
            assert!(same(d.threshold as f64, want, TOL), "want {want}, {ctx}");
            let t64 = d.threshold as f64;
            assert!(
                t64 <= exact * (1.0 + 1e-6) && t64 > exact * (1.0 - 2f64.powi(-(m as i32))),
                "threshold {t64} outside the bound below the exact {exact}, {ctx}"
            );
            floored += (t64 < exact * (1.0 - 1e-6)) as usize;
            let coefficient = reference::clip_coefficient(d.norm as f64, t64, Semantics::Torch);
            assert!(same(got.coefficient as f64, coefficient, TOL), "{ctx}");
            for (x, y) in data.iter().zip(&after) {
                let expect = *x as f64 * coefficient;
                let ok = if expect.is_nan() {
                    y.is_nan()
                } else {
                    (*y as f64 - expect).abs() <= TOL * expect.abs() + 1e-30
                };
                assert!(ok, "{ctx}: {x} -> {y}, want {expect}");
            }
        }
        assert_eq!(skipped, 1, "the NaN step");
        assert!(
            floored > 100,
            "m {m}: only {floored} thresholds below the exact percentile"
        );

        // Save, restore into a fresh set, carry on identically.
        let state = pollster::block_on(run.adaptive.save_state()).unwrap();
        let other = Run::new(method, Semantics::Torch);
        other.adaptive.restore_state(&state).unwrap();
        for _ in 0..3 {
            let data = reference::gradients_with_norm(&mut rng, len, 1.5);
            let (a, _) = run.step(&data);
            let (b, _) = other.step(&data);
            assert_eq!(a.bits(), b.bits(), "m {m}: restored state");
        }
        let mut corrupt = pollster::block_on(run.adaptive.save_state()).unwrap();
        corrupt[64] = corrupt[64].wrapping_add(1);
        assert!(matches!(
            other.adaptive.restore_state(&corrupt),
            Err(gradclip::Error::InvalidAdaptiveState(_))
        ));
    }
    assert_no_wgpu_errors();
}

/// Tensor sizes of the AdaGC set (one per column of `synthetic_tensor_norms`).
const ADAGC_SIZES: [usize; 4] = [400, 130, 64, 300];

/// AdaGC over the 500-step per-tensor sequence against its reference:
/// every tensor's threshold, factor and γ, and every clipped gradient.
fn adagc_against(method: gradclip::AdaGc, cfg: reference::AdaGcConfig) -> Vec<Vec<u32>> {
    let run = Run::with_sizes(method.into(), method.semantics, &ADAGC_SIZES);
    let mut want_ref = reference::AdaGc::new(cfg, ADAGC_SIZES.len());
    let sequence = reference::synthetic_tensor_norms(reference::SYNTH_SEED);
    let mut rng = Rng::new(0x00ad_a6c0);
    let g = gpu();
    let mut bits = Vec::new();
    let (mut clipped, mut on_edge) = (0, 0);
    for (t, targets) in sequence.iter().enumerate() {
        let mut data = Vec::new();
        let mut norms = Vec::new();
        for (&size, &target) in ADAGC_SIZES.iter().zip(targets) {
            let part = reference::gradients_with_norm(&mut rng, size, target);
            norms.push(norm64(&part));
            data.extend(part);
        }
        let want = want_ref.step(&norms);
        run.record(&data, &run.clip);
        let decision = pollster::block_on(run.adaptive.read_decision()).unwrap();
        let tensors = pollster::block_on(run.adaptive.read_tensor_decisions()).unwrap();
        let after = download(&g.device, &g.queue, &run.buffer, data.len());
        assert_no_wgpu_errors();
        let ctx = format!("step {t}: gpu {decision:?} {tensors:?}\nreference {want:?}");
        assert_eq!(decision.skipped, want.skipped, "skipped, {ctx}");
        assert_eq!(decision.warmup, want.warmup, "warm-up, {ctx}");
        assert!(
            same(decision.norm as f64, want.total_norm, 1e-6),
            "total, {ctx}"
        );
        let mut start = 0;
        for (i, (got, w)) in tensors.iter().zip(&want.tensors).enumerate() {
            assert!(
                same(got.norm as f64, w.norm, 1e-6),
                "tensor {i} norm, {ctx}"
            );
            assert!(
                same(got.threshold as f64, w.threshold, TOL),
                "tensor {i} threshold, {ctx}"
            );
            assert!(
                same(got.coefficient as f64, w.coefficient, TOL),
                "tensor {i} coefficient {} vs {}, {ctx}",
                got.coefficient,
                w.coefficient
            );
            let gamma = want_ref.gamma[i];
            assert_eq!(got.gamma.is_some(), gamma.is_some(), "tensor {i} γ, {ctx}");
            if let (Some(a), Some(b)) = (got.gamma, gamma) {
                assert!(same(a as f64, b, TOL), "tensor {i} γ {a} vs {b}, {ctx}");
            }
            if w.margin <= EDGE {
                on_edge += 1;
            }
            clipped += (w.clipped && !want.warmup) as usize;
            let end = start + ADAGC_SIZES[i];
            for (j, (&before, &a)) in data[start..end].iter().zip(&after[start..end]).enumerate() {
                let expect = before as f64 * w.coefficient;
                let ok = if expect.is_nan() {
                    a.is_nan()
                } else {
                    (a as f64 - expect).abs() <= TOL * expect.abs() + 1e-30
                };
                assert!(ok, "tensor {i} element {j} = {a}, want {expect}, {ctx}");
            }
            start = end;
            bits.push(got.coefficient.to_bits());
        }
        bits.push(decision.norm.to_bits());
    }
    assert!(
        clipped >= 3,
        "only {clipped} per-tensor clips after warm-up"
    );
    assert!(
        on_edge <= 5,
        "{on_edge} decisions within {EDGE:e} of a boundary"
    );
    vec![bits]
}

#[test]
fn adagc_defaults_follow_the_authors_code_and_repeat_bit_for_bit() {
    let _turn = serial();
    let first = adagc_against(gradclip::AdaGc::new(), reference::AdaGcConfig::default());
    let second = adagc_against(gradclip::AdaGc::new(), reference::AdaGcConfig::default());
    assert_eq!(first, second, "two runs differ");
}

#[test]
fn adagc_short_warmup_under_tensorflow() {
    let _turn = serial();
    let method = gradclip::AdaGc::new()
        .warmup_steps(20)
        .lambda_abs(2.5)
        .beta(0.9)
        .semantics(Semantics::TensorFlow);
    let cfg = reference::AdaGcConfig {
        warmup_steps: 20,
        lambda_abs: 2.5,
        beta: 0.9,
        semantics: Semantics::TensorFlow,
        ..Default::default()
    };
    adagc_against(method, cfg);
}

#[test]
fn adagc_without_warmup_starts_each_gamma_at_its_first_norm() {
    let _turn = serial();
    let method = gradclip::AdaGc::new().warmup_steps(0);
    let cfg = reference::AdaGcConfig {
        warmup_steps: 0,
        ..Default::default()
    };
    adagc_against(method, cfg);
}

/// A state saved mid-run and restored into a new adaptive clip on another
/// set carries on exactly as the original does.
fn save_and_restore(method: AdaptiveMethod) {
    let targets = reference::synthetic_norms(reference::SYNTH_SEED);
    let len: usize = SIZES.iter().sum();
    let mut rng = Rng::new(7);
    let data: Vec<Vec<f32>> = targets
        .iter()
        .take(300)
        .map(|&t| reference::gradients_with_norm(&mut rng, len, t))
        .collect();
    let original = Run::new(method, Semantics::Torch);
    for d in &data[..150] {
        original.step(d);
    }
    let saved = pollster::block_on(original.adaptive.save_state()).unwrap();
    assert_eq!(saved.len() as u64, original.adaptive.state_size());
    let resumed = Run::new(method, Semantics::Torch);
    resumed.adaptive.restore_state(&saved).unwrap();
    for (t, d) in data[150..].iter().enumerate() {
        let (a, after_a) = original.step(d);
        let (b, after_b) = resumed.step(d);
        assert_eq!(a.bits(), b.bits(), "step {} after the restore", t + 150);
        assert_eq!(
            bytemuck::cast_slice::<f32, u32>(&after_a),
            bytemuck::cast_slice::<f32, u32>(&after_b)
        );
    }
    // A restore of the resumed state's own bytes changes nothing.
    let again = pollster::block_on(resumed.adaptive.save_state()).unwrap();
    resumed.adaptive.restore_state(&again).unwrap();
    assert_eq!(
        pollster::block_on(resumed.adaptive.save_state()).unwrap(),
        again
    );
}

#[test]
fn zclip_state_survives_save_and_restore() {
    let _turn = serial();
    save_and_restore(gradclip::ZClip::new().into());
}

#[test]
fn adagc_state_survives_save_and_restore() {
    let _turn = serial();
    let method: AdaptiveMethod = gradclip::AdaGc::new().warmup_steps(30).into();
    let sequence = reference::synthetic_tensor_norms(reference::SYNTH_SEED);
    let mut rng = Rng::new(11);
    let data: Vec<Vec<f32>> = sequence
        .iter()
        .take(200)
        .map(|targets| {
            ADAGC_SIZES
                .iter()
                .zip(targets)
                .flat_map(|(&n, &t)| reference::gradients_with_norm(&mut rng, n, t))
                .collect()
        })
        .collect();
    let original = Run::with_sizes(method, Semantics::Torch, &ADAGC_SIZES);
    let g = gpu();
    let step = |run: &Run, d: &[f32]| {
        run.record(d, &run.clip);
        let t = pollster::block_on(run.adaptive.read_tensor_decisions()).unwrap();
        (t, download(&g.device, &g.queue, &run.buffer, d.len()))
    };
    for d in &data[..100] {
        step(&original, d);
    }
    let saved = pollster::block_on(original.adaptive.save_state()).unwrap();
    let resumed = Run::with_sizes(method, Semantics::Torch, &ADAGC_SIZES);
    resumed.adaptive.restore_state(&saved).unwrap();
    for (t, d) in data[100..].iter().enumerate() {
        let (a, after_a) = step(&original, d);
        let (b, after_b) = step(&resumed, d);
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {}", t + 100);
        assert_eq!(
            bytemuck::cast_slice::<f32, u32>(&after_a),
            bytemuck::cast_slice::<f32, u32>(&after_b)
        );
    }
    assert_no_wgpu_errors();
}

#[test]
fn autoclip_state_survives_save_and_restore() {
    let _turn = serial();
    save_and_restore(gradclip::AutoClip::new(25.0).window(64).into());
}

#[test]
fn restore_rejects_foreign_or_corrupt_state() {
    let _turn = serial();
    let z = Run::new(gradclip::ZClip::new().into(), Semantics::Torch);
    let a = Run::new(
        gradclip::AutoClip::new(10.0).window(25).into(),
        Semantics::Torch,
    );
    // Same size (25 slots each), different method.
    let auto_bytes = pollster::block_on(a.adaptive.save_state()).unwrap();
    assert_eq!(auto_bytes.len() as u64, z.adaptive.state_size());
    let err = z.adaptive.restore_state(&auto_bytes).unwrap_err();
    assert!(
        matches!(err, gradclip::Error::InvalidAdaptiveState(_)),
        "{err}"
    );
    let mut zbytes = pollster::block_on(z.adaptive.save_state()).unwrap();
    assert!(z.adaptive.restore_state(&zbytes[1..]).is_err());
    // A NaN mean with the EMA started.
    zbytes[20..24].copy_from_slice(&1u32.to_le_bytes());
    zbytes[24..28].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(matches!(
        z.adaptive.restore_state(&zbytes),
        Err(gradclip::Error::InvalidAdaptiveState(_))
    ));
}

#[test]
fn invalid_parameters_and_unsupported_clips_are_errors() {
    let _turn = serial();
    let g = gpu();
    let buffer = upload(&g.device, &[1.0; 8]);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[8]).unwrap())
        .unwrap();
    for method in [
        AdaptiveMethod::from(gradclip::ZClip::new().alpha(1.0)),
        gradclip::ZClip::new().warmup_steps(0).into(),
        gradclip::ZClip::new().z_thresh(f32::NAN).into(),
        gradclip::ZClip::new().max_norm(Some(-1.0)).into(),
        gradclip::AutoClip::new(100.5).into(),
        gradclip::AutoClip::new(10.0).window(0).into(),
        gradclip::AutoClip::new(10.0).window(u32::MAX).into(),
        gradclip::AdaGc::new().beta(1.0).into(),
        gradclip::AdaGc::new().lambda_rel(0.0).into(),
        gradclip::AdaGc::new().lambda_abs(f32::INFINITY).into(),
    ] {
        assert!(
            matches!(
                AdaptiveClip::new(&set, method),
                Err(gradclip::Error::InvalidAdaptive(_))
            ),
            "{method:?}"
        );
    }
    let adaptive = AdaptiveClip::new(&set, gradclip::ZClip::new()).unwrap();
    let other = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[8]).unwrap())
        .unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    for (s, clip) in [
        (&set, ClipNorm::new(1.0).per_tensor(true)),
        (&set, ClipNorm::new(1.0).tensor_norms(true)),
        (&other, ClipNorm::new(1.0)),
    ] {
        assert!(matches!(
            adaptive.clip(s, &mut encoder, &clip),
            Err(gradclip::Error::Unsupported(_))
        ));
    }
    let adagc = AdaptiveClip::new(&set, gradclip::AdaGc::new()).unwrap();
    assert!(matches!(
        adagc.clip(&set, &mut encoder, &ClipNorm::tensorflow(1.0)),
        Err(gradclip::Error::Unsupported(_))
    ));
    // Its factors are per tensor: no single coefficient for an optimizer.
    assert!(matches!(
        adagc.record_norm(&set, &mut encoder, &ClipNorm::new(1.0)),
        Err(gradclip::Error::Unsupported(_))
    ));
    // Nothing was recorded on either set.
    assert_eq!((set.steps_recorded(), other.steps_recorded()), (0, 0));
    drop(encoder);
    assert_no_wgpu_errors();
}

#[test]
fn the_adaptive_records_are_where_the_host_puts_them() {
    let _turn = serial();
    let params = check_module(&gradclip::shaders::ADAPTIVE, |_| {});
    let adagc_params = check_module(&gradclip::shaders::ADAPTIVE_ADAGC, |record| {
        // AdaGC's view of the set's stats puts the per-tensor array where the host does.
        let (_, stats) = record("Stats");
        let tensors = stats.iter().find(|(n, _)| n == "tensors").unwrap().1;
        assert_eq!(tensors as u64, gradclip::records::STATS_TENSORS_OFFSET);
    });
    // Both modules take the parameter record from adaptive_records.wgsl, and
    // the host writes one layout for both. (tests/native/shaders.rs
    // validates and translates every entry point for every backend.)
    assert_eq!(params, adagc_params);
}

type Record = (u32, Vec<(String, u32)>);

/// Checks the adaptive records' layout in `pass` (and what `more` checks);
/// returns `AdaptiveParams`' layout.
fn check_module(
    pass: &gradclip::shaders::PassModule,
    more: impl FnOnce(&dyn Fn(&str) -> Record),
) -> Record {
    let module = naga::front::wgsl::parse_str(&pass.source()).expect("parse");
    // The host's offsets into the records, read back from the WGSL.
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).unwrap();
    let record = |name: &str| {
        let (handle, ty) = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no struct {name}"));
        let naga::TypeInner::Struct { members, .. } = &ty.inner else {
            panic!("{name} is not a struct");
        };
        let offsets: Vec<(String, u32)> = members
            .iter()
            .map(|m| (m.name.clone().unwrap(), m.offset))
            .collect();
        (layouter[handle].size, offsets)
    };
    let params = record("AdaptiveParams");
    assert_eq!(params.0, 64);
    let (_, state) = record("AdaptiveState");
    let at = |name: &str| state.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!((at("max_norm"), at("history")), (48, 64));
    more(&record);
    params
}

/// One AGC tensor: shape, unit convention, gradients, parameters.
type AgcTensor = (Vec<usize>, reference::Units, Vec<f32>, Vec<f32>);

/// `x` as stored in `dtype` (exact for f32; 16-bit rounded to nearest even).
fn stored(x: f32, dtype: GradType) -> f32 {
    match dtype {
        GradType::F32 => x,
        GradType::F16 => half::f16::from_f32(x).to_f32(),
        GradType::Bf16 => half::bf16::from_f32(x).to_f32(),
    }
}

/// The 16-bit pattern of `x` in `dtype` (rounded to nearest even).
fn bits16(x: f32, dtype: GradType) -> u16 {
    match dtype {
        GradType::F16 => half::f16::from_f32(x).to_bits(),
        GradType::Bf16 => half::bf16::from_f32(x).to_bits(),
        GradType::F32 => unreachable!("f32 has no 16-bit pattern"),
    }
}

/// Marks the padding element after an odd-sized 16-bit tensor, which AGC must not change.
const PAD_BITS: u16 = 0x7e5a;

/// Packs `values` (one per tensor) in a buffer of `dtype` as `layout`'s
/// packed ranges place them, padding set to [`PAD_BITS`]; little-endian bytes.
fn packed_bytes(layout: &GradLayout, values: &[&[f32]], dtype: GradType) -> Vec<u8> {
    if dtype == GradType::F32 {
        return values
            .iter()
            .flat_map(|v| v.iter().flat_map(|x| x.to_le_bytes()))
            .collect();
    }
    let words = layout.packed_elements(dtype).div_ceil(2) as usize;
    let mut halves = vec![PAD_BITS; 2 * words];
    for (i, v) in values.iter().enumerate() {
        let start = layout.packed_range(i, dtype).start as usize;
        for (k, &x) in v.iter().enumerate() {
            halves[start + k] = bits16(x, dtype);
        }
    }
    halves.iter().flat_map(|h| h.to_le_bytes()).collect()
}

/// Runs AGC on the GPU over `cases` packed in one buffer of `dtype` (their
/// values first rounded to it), compares every unit with Optax's formula in
/// float64 (general axes) and every gradient with the formula's result: f32
/// within [`TOL`]; 16-bit exactly the stored f32 product with the GPU's factor
/// rounded to nearest even, and within that rounding of the float64 result.
/// Padding halves keep their bits. Returns how many units clipped.
fn agc_against_optax(cases: &[AgcTensor], dtype: GradType) -> usize {
    let g = gpu();
    agc_against_optax_on(&g.device, &g.queue, cases, dtype)
}

/// [`agc_against_optax`] on a device of the test's own.
fn agc_against_optax_on(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    cases: &[AgcTensor],
    dtype: GradType,
) -> usize {
    let cases: Vec<AgcTensor> = cases
        .iter()
        .map(|(shape, units, grad, param)| {
            let q = |v: &Vec<f32>| v.iter().map(|&x| stored(x, dtype)).collect();
            (shape.clone(), units.clone(), q(grad), q(param))
        })
        .collect();
    let sizes: Vec<usize> = cases.iter().map(|c| c.2.len()).collect();
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let grads: Vec<&[f32]> = cases.iter().map(|c| c.2.as_slice()).collect();
    let params: Vec<&[f32]> = cases.iter().map(|c| c.3.as_slice()).collect();
    let grad_bytes = packed_bytes(&layout, &grads, dtype);
    let grad_buffer = common::buffers::upload_bytes(device, &grad_bytes);
    let param_buffer =
        common::buffers::upload_bytes(device, &packed_bytes(&layout, &params, dtype));
    let shapes: Vec<(&[usize], gradclip::AgcUnits)> = cases
        .iter()
        .map(|c| {
            let units = match c.1 {
                reference::Units::Optax => gradclip::AgcUnits::Optax,
                reference::Units::Torch => gradclip::AgcUnits::Torch,
                reference::Units::Axes(_) => unreachable!("no GPU form"),
            };
            (c.0.as_slice(), units)
        })
        .collect();
    let agc = gradclip::AgcClip::new_as(
        device,
        queue,
        &grad_buffer,
        &param_buffer,
        &layout,
        dtype,
        &shapes,
        gradclip::Agc::new(reference::AGC_CLIPPING as f32).eps(reference::AGC_EPS as f32),
    )
    .unwrap();
    let mut encoder = device.create_command_encoder(&Default::default());
    agc.clip(&mut encoder).unwrap();
    queue.submit([encoder.finish()]);
    let units = pollster::block_on(agc.read_units()).unwrap();
    let after: Vec<u8> = download(device, queue, &grad_buffer, grad_bytes.len() / 4)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_no_wgpu_errors();
    let element = |e: usize| -> f32 {
        match dtype {
            GradType::F32 => f32::from_le_bytes(after[4 * e..4 * e + 4].try_into().unwrap()),
            _ => {
                let h = u16::from_le_bytes([after[2 * e], after[2 * e + 1]]);
                match dtype {
                    GradType::F16 => half::f16::from_bits(h).to_f32(),
                    _ => half::bf16::from_bits(h).to_f32(),
                }
            }
        }
    };
    // Half an ulp of the 16-bit type, relative (f32: the usual tolerance).
    let rounding = match dtype {
        GradType::F32 => TOL,
        GradType::F16 => 2f64.powi(-11) * (1.0 + 1e-6),
        GradType::Bf16 => 2f64.powi(-8) * (1.0 + 1e-6),
    };
    let (mut u0, mut clipped) = (0, 0);
    for (i, (shape, convention, grad, param)) in cases.iter().enumerate() {
        let axes = reference::unit_axes(shape, convention).unwrap();
        let want = reference::agc_optax(
            &reference::Tensor::new(shape, grad.clone()),
            &reference::Tensor::new(shape, param.clone()),
            reference::AGC_CLIPPING,
            reference::AGC_EPS,
            &axes,
        );
        for (k, w) in want.units.iter().enumerate() {
            let got = &units[u0 + k];
            let ctx = format!("{dtype:?} {shape:?} unit {k}: gpu {got:?}, want {w:?}");
            // Norms of all-zero units are exactly 0 on both sides.
            assert!(same(got.grad_norm as f64, w.grad_norm, 1e-5), "{ctx}");
            assert!(same(got.param_norm as f64, w.param_norm, 1e-5), "{ctx}");
            assert!(same(got.max_norm as f64, w.max_norm, 1e-5), "{ctx}");
            if reference::margin(w.grad_norm, w.max_norm) > EDGE {
                assert_eq!(got.clipped(), w.clipped, "{ctx}");
            }
            assert!(same(got.factor as f64, w.factor, 1e-5), "{ctx}");
            clipped += w.clipped as usize;
        }
        let range = layout.packed_range(i, dtype);
        let view = reference::UnitView::of(shape, &axes);
        for (k, &want_g) in want.grad.iter().enumerate() {
            let got = element(range.start as usize + k);
            let ctx = format!("{dtype:?} {shape:?} element {k} = {got}, want {want_g}");
            if want_g.is_nan() {
                assert!(got.is_nan(), "{ctx}");
                continue;
            }
            // The smallest subnormal of the type, for results that round to 0.
            let tiny = match dtype {
                GradType::F32 => 1e-30,
                GradType::F16 => 2f64.powi(-25),
                GradType::Bf16 => 2f64.powi(-134),
            };
            assert!(
                (got as f64 - want_g).abs() <= rounding * want_g.abs() + tiny,
                "{ctx}"
            );
            if dtype != GradType::F32 {
                // Bit for bit what the shader's formula gives: the stored
                // value times the unit's factor in f32, rounded once.
                if let Some(view) = &view {
                    let factor = units[u0 + view.unit_of(k)].factor;
                    let exact = if factor == 1.0 {
                        grad[k]
                    } else {
                        stored(grad[k] * factor, dtype)
                    };
                    assert_eq!(got.to_bits(), exact.to_bits(), "{ctx}");
                }
            }
        }
        if dtype != GradType::F32 && grad.len() % 2 == 1 {
            let pad = range.end as usize;
            assert_eq!(
                u16::from_le_bytes([after[2 * pad], after[2 * pad + 1]]),
                PAD_BITS,
                "{dtype:?} {shape:?}: padding changed"
            );
        }
        u0 += want.units.len();
    }
    assert_eq!(u0 as u32, agc.unit_count());
    clipped
}

#[test]
fn agc_follows_optax_on_every_layout_with_zero_norm_units() {
    let _turn = serial();
    let mut clipped = 0;
    for seed in 0..8 {
        let cases: Vec<_> = reference::agc_cases(seed)
            .into_iter()
            .map(|c| (c.grad.shape.clone(), c.units, c.grad.data, c.param.data))
            .collect();
        clipped += agc_against_optax(&cases, GradType::F32);
    }
    assert!(clipped > 50, "only {clipped} units clipped");
}

#[test]
fn agc_on_f16_and_bf16_follows_optax_and_never_writes_padding() {
    let _turn = serial();
    for dtype in [GradType::F16, GradType::Bf16] {
        let mut clipped = 0;
        for seed in 0..4 {
            let mut cases: Vec<_> = reference::agc_cases(seed)
                .into_iter()
                .map(|c| (c.grad.shape.clone(), c.units, c.grad.data, c.param.data))
                .collect();
            // Odd sizes (a padding half after each) and JAX IO units that
            // share 32-bit words with their neighbours (Q = 3, odd).
            let mut rng = Rng::new(seed + 100);
            let mut normal = |n: usize, s: f64| -> Vec<f32> {
                (0..n).map(|_| (s * rng.normal()) as f32).collect()
            };
            cases.push((
                vec![5, 3],
                reference::Units::Optax,
                normal(15, 1.0),
                normal(15, 0.5),
            ));
            cases.push((
                vec![3],
                reference::Units::Optax,
                vec![1.0, 2.0, 2.0],
                vec![0.0; 3],
            ));
            cases.push((
                vec![7, 1],
                reference::Units::Torch,
                normal(7, 0.1),
                normal(7, 1.0),
            ));
            clipped += agc_against_optax(&cases, dtype);
        }
        assert!(clipped > 20, "{dtype:?}: only {clipped} units clipped");
    }
}

/// A device whose dispatches hold 7 workgroups per dimension: AGC's two
/// dispatches must stay within it (they were capped at a fixed 65535) and
/// stride over 300 units and their 1 800 words.
#[test]
fn agc_stays_within_a_narrow_dispatch_limit() {
    let _turn = serial();
    let (device, queue, _) = common::device_with_limits("7-workgroup device", |l| {
        l.max_compute_workgroups_per_dimension = 7;
    });
    let mut rng = Rng::new(7);
    let rows = 300;
    let grad: Vec<f32> = (0..6 * rows).map(|_| (0.3 * rng.normal()) as f32).collect();
    let param: Vec<f32> = (0..6 * rows).map(|_| rng.normal() as f32).collect();
    let cases = vec![(vec![rows, 6], reference::Units::Torch, grad, param)];
    assert!(agc_against_optax_on(&device, &queue, &cases, GradType::F32) > 10);
}

#[test]
fn agc_strides_over_more_units_than_one_dispatch_holds_and_keeps_nan_local() {
    let _turn = serial();
    // 70 000 PyTorch rows: more units than 65 535 workgroups; one row NaN.
    let mut rng = Rng::new(3);
    let rows = 70_000;
    let mut grad: Vec<f32> = (0..2 * rows)
        .map(|_| (0.02 * rng.normal()) as f32)
        .collect();
    let param: Vec<f32> = (0..2 * rows).map(|_| rng.normal() as f32).collect();
    grad[2 * 69_999] = f32::NAN;
    let cases = vec![
        (vec![rows, 2], reference::Units::Torch, grad, param),
        (
            vec![3],
            reference::Units::Optax,
            vec![1.0, 2.0, 2.0],
            vec![0.0; 3],
        ),
    ];
    assert!(agc_against_optax(&cases, GradType::F32) > 1000);
}

/// 500 steps recorded and submitted back to back with no read in between
/// (each step's gradients written with `queue.write_buffer`): the threshold
/// never visits the host, yet the last 32 steps' coefficients in the set's
/// report log, the EMA left on the GPU and the last step's gradients match
/// the float64 reference.
#[test]
fn zclip_runs_500_steps_without_the_host() {
    let _turn = serial();
    let g = gpu();
    let run = Run::new(gradclip::ZClip::new().into(), Semantics::Torch);
    let mut z = reference::ZClip::new(reference::ZClipConfig::default());
    let targets = reference::synthetic_norms(reference::SYNTH_SEED);
    let mut rng = Rng::new(0x00ad_a971);
    let len: usize = SIZES.iter().sum();
    let mut want = Vec::new();
    let mut last = Vec::new();
    for &target in &targets {
        let data = reference::gradients_with_norm(&mut rng, len, target);
        want.push(z.step(norm64(&data)));
        run.record(&data, &run.clip);
        last = data;
    }
    // One report per step: the log holds the last 64 of the 500.
    let reports = pollster::block_on(run.set.take_reports()).unwrap();
    assert_eq!(run.set.steps_recorded(), targets.len() as u64);
    let steps: Vec<u64> = reports.reports.iter().map(|r| r.step).collect();
    let final_step = targets.len() as u64;
    assert_eq!(steps, (final_step - 63..=final_step).collect::<Vec<_>>());
    for r in &reports.reports {
        let w = &want[(r.step - 1) as usize];
        assert!(
            same(r.coefficient as f64, w.coefficient, TOL),
            "set step {}: {} vs {w:?}",
            r.step,
            r.coefficient
        );
    }
    let state = pollster::block_on(run.adaptive.save_state()).unwrap();
    let word = |i: usize| f32::from_le_bytes(state[4 * i..4 * i + 4].try_into().unwrap()) as f64;
    let (mean, var) = z.state.ema.unwrap();
    assert!(same(word(6), mean, TOL) && same(word(7), var, TOL), "EMA");
    let after = download(&g.device, &g.queue, &run.buffer, len);
    let c = want.last().unwrap().coefficient;
    for (&b, &a) in last.iter().zip(&after) {
        assert!((a as f64 - b as f64 * c).abs() <= TOL * (b as f64 * c).abs() + 1e-30);
    }
    assert_no_wgpu_errors();
}

/// ZClip, AutoClip and AdaGC with loss scaling: a set clipping gradients scaled by
/// the loss scale, with `unscale`, makes the same decisions and leaves the
/// same gradients as a set clipping the unscaled ones; the loss scale is
/// updated once per step (it doubles after `growth_interval` steps, not
/// half as many), and an overflowed step leaves the gradients and the
/// method's state untouched and halves the scale.
#[test]
fn adaptive_clips_unscale_once_per_step() {
    let _turn = serial();
    let g = gpu();
    let methods: [AdaptiveMethod; 3] = [
        gradclip::ZClip::new().warmup_steps(5).into(),
        gradclip::AutoClip::new(50.0).into(),
        gradclip::AdaGc::new().warmup_steps(5).into(),
    ];
    for method in methods {
        let adagc = matches!(method, AdaptiveMethod::AdaGc(_));
        let plain = Run::new(method, Semantics::Torch);
        let scaled = Run::new(method, Semantics::Torch);
        scaled
            .set
            .set_loss_scaler(
                &gradclip::LossScaler::new()
                    .init_scale(1024.0)
                    .growth_interval(10),
            )
            .unwrap();
        let unscale = ClipNorm::new(1.0).unscale(true);
        let targets = reference::synthetic_norms(reference::SYNTH_SEED);
        let mut rng = Rng::new(0x5ca1_ab1e);
        let len: usize = SIZES.iter().sum();
        let mut scale = 1024.0f32;
        let mut scales = Vec::new();
        let mut clipped_tensors = 0;
        for (t, &target) in targets.iter().take(40).enumerate() {
            let data = reference::gradients_with_norm(&mut rng, len, target);
            let mut up: Vec<f32> = data.iter().map(|x| x * scale).collect();
            if t == 17 {
                // An overflow in the scaled backward pass.
                up[3] = f32::INFINITY;
                let state = pollster::block_on(scaled.adaptive.save_state()).unwrap();
                scaled.record(&up, &unscale);
                let report = pollster::block_on(scaled.set.read_report()).unwrap();
                assert!(report.found_inf, "{method:?}: {report:?}");
                assert_eq!(report.coefficient, 1.0);
                let after = download(&g.device, &g.queue, &scaled.buffer, len);
                assert_eq!(
                    bytemuck::cast_slice::<f32, u32>(&after),
                    bytemuck::cast_slice::<f32, u32>(&up)
                );
                let kept = pollster::block_on(scaled.adaptive.save_state()).unwrap();
                // The statistics (the first 32 bytes) and the history (from
                // byte 64) stay; the latest decision's words say it skipped.
                // AdaGC's history also holds each tensor's latest decision
                // (norm, threshold, factor after γ): only the γs must stay.
                let history = |b: &[u8]| -> Vec<u8> {
                    if adagc {
                        b[64..].chunks(16).flat_map(|t| t[..4].to_vec()).collect()
                    } else {
                        b[64..].to_vec()
                    }
                };
                assert_eq!(
                    (&state[..32], history(&state)),
                    (&kept[..32], history(&kept)),
                    "{method:?}: an overflowed step moved the state"
                );
                let decision = pollster::block_on(scaled.adaptive.read_decision()).unwrap();
                assert!(decision.skipped, "{method:?}: {decision:?}");
                assert_eq!(report.loss_scale, scale / 2.0);
                scale = report.loss_scale;
                scales.push(scale);
                continue;
            }
            plain.record(&data, &plain.clip);
            scaled.record(&up, &unscale);
            let (a, b) = (
                pollster::block_on(plain.set.read_report()).unwrap(),
                pollster::block_on(scaled.set.read_report()).unwrap(),
            );
            let ctx = format!("{method:?} step {t}: {a:?} vs {b:?}");
            assert!(!b.found_inf, "{ctx}");
            assert_eq!(b.step, t as u64 + 1, "one report per step: {ctx}");
            assert_eq!(b.unscaled_by, scale, "{ctx}");
            assert!(
                same(b.total_norm as f64, a.total_norm as f64, 1e-6),
                "{ctx}"
            );
            assert!(same(b.max_norm as f64, a.max_norm as f64, 1e-6), "{ctx}");
            let (da, db) = (
                pollster::block_on(plain.adaptive.read_decision()).unwrap(),
                pollster::block_on(scaled.adaptive.read_decision()).unwrap(),
            );
            assert_eq!(da.clipped, db.clipped, "{ctx}");
            if adagc {
                let (ta, tb) = (
                    pollster::block_on(plain.adaptive.read_tensor_decisions()).unwrap(),
                    pollster::block_on(scaled.adaptive.read_tensor_decisions()).unwrap(),
                );
                for (x, y) in ta.iter().zip(&tb) {
                    assert!(
                        same(y.norm as f64, x.norm as f64, 1e-6),
                        "{ctx}: {x:?} vs {y:?}"
                    );
                    assert!(
                        same(y.threshold as f64, x.threshold as f64, 1e-6),
                        "{ctx}: {x:?} vs {y:?}"
                    );
                    assert!(
                        same(y.coefficient as f64, x.coefficient as f64, 1e-6),
                        "{ctx}: {x:?} vs {y:?}"
                    );
                }
                clipped_tensors += ta.iter().filter(|x| x.coefficient < 1.0).count();
            }
            let after_a = download(&g.device, &g.queue, &plain.buffer, len);
            let after_b = download(&g.device, &g.queue, &scaled.buffer, len);
            for (x, y) in after_a.iter().zip(&after_b) {
                assert!(same(*y as f64, *x as f64, 1e-6), "{ctx}: {x} vs {y}");
            }
            scale = b.loss_scale;
            scales.push(scale);
        }
        // GradScaler's schedule: x2 after each 10 finite steps in a row, /2 on
        // the overflow (step 17, which also restarts the count).
        let mut want = Vec::new();
        let (mut s, mut good) = (1024.0f32, 0);
        for t in 0..40 {
            if t == 17 {
                s /= 2.0;
                good = 0;
            } else {
                good += 1;
                if good == 10 {
                    s *= 2.0;
                    good = 0;
                }
            }
            want.push(s);
        }
        assert_eq!(scales, want, "{method:?}");
        if adagc {
            assert!(
                clipped_tensors > 3,
                "AdaGC clipped only {clipped_tensors} tensors"
            );
        }
    }
    assert_no_wgpu_errors();
}
