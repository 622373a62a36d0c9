//! The float64 references of the adaptive clipping methods checked against
//! what the papers and their code say, on small cases computed by hand and
//! on properties (warm-up, spikes, drift, a NaN step, percentiles, AGC
//! units). No GPU: these are the yardsticks the GPU tests measure against.

use crate::common;

use common::adaptive_reference::*;
use gradclip::Semantics;

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs().max(f64::MIN_POSITIVE)
}

macro_rules! assert_close {
    ($got:expr, $want:expr, $tol:expr) => {{
        let (got, want): (f64, f64) = ($got, $want);
        assert!(
            close(got, want, $tol),
            "{} = {got:e}, want {want:e}",
            stringify!($got)
        );
    }};
}

// ---------------------------------------------------------------- shared

#[test]
fn coefficient_follows_each_semantics() {
    let t = Semantics::Torch;
    let tf = Semantics::TensorFlow;
    assert_eq!(clip_coefficient(2.0, 1.0, t), 1.0 / (2.0 + 1e-6));
    assert_eq!(clip_coefficient(0.5, 1.0, t), 1.0);
    assert_eq!(clip_coefficient(2.0, 1.0, tf), 0.5);
    assert_eq!(clip_coefficient(1.0, 1.0, tf), 1.0);
    // No threshold: untouched, whatever the semantics.
    assert_eq!(clip_coefficient(1e30, f64::INFINITY, t), 1.0);
    assert_eq!(clip_coefficient(1e30, f64::INFINITY, tf), 1.0);
    // A zero threshold with a zero norm leaves TensorFlow's gradients alone.
    assert_eq!(clip_coefficient(0.0, 0.0, tf), 1.0);
    assert_eq!(clip_coefficient(3.0, 0.0, t), 0.0);
    // Non-finite norms as gradclip's fixed clips treat them.
    assert!(clip_coefficient(f64::NAN, 1.0, t).is_nan());
    assert_eq!(clip_coefficient(f64::INFINITY, 1.0, t), 0.0);
    assert!(clip_coefficient(f64::INFINITY, 1.0, tf).is_nan());
}

// ---------------------------------------------------------------- ZClip

fn zclip(alpha: f64, warmup: usize) -> ZClip {
    ZClip::new(ZClipConfig {
        alpha,
        warmup_steps: warmup,
        ..ZClipConfig::default()
    })
}

/// A ZClip with α = 0.5 whose EMA has just started from the norms 1, 2, 3, 4
/// (mean 2.5, population variance 1.25).
fn zclip_started(cfg: ZClipConfig) -> ZClip {
    let mut z = ZClip::new(ZClipConfig {
        alpha: 0.5,
        warmup_steps: 4,
        ..cfg
    });
    for g in [1.0, 2.0, 3.0, 4.0] {
        z.step(g);
    }
    assert_eq!(z.state.ema, Some((2.5, 1.25)));
    z
}

#[test]
fn zclip_warmup_collects_norms_then_starts_from_their_mean_and_variance() {
    let mut z = zclip(0.97, 4);
    for (i, g) in [1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
        let out = z.step(g);
        assert_eq!(out.coefficient, 1.0, "no cap: warm-up never clips");
        assert_eq!(out.threshold, f64::INFINITY);
        assert_eq!(out.boundary, f64::INFINITY);
        assert!(!out.clipped && !out.spike && !out.skipped);
        if i < 3 {
            assert_eq!(z.state.ema, None);
            assert_eq!(z.state.warmup.len(), i + 1);
        }
    }
    // Started on the 4th step, from the population variance (divide by n).
    assert_eq!(z.state.ema, Some((2.5, 1.25)));
    assert!(z.state.warmup.is_empty());
    assert_eq!(z.state.steps, 4);
}

#[test]
fn zclip_ema_updates_mean_first_then_variance_around_the_new_mean() {
    let mut z = zclip_started(ZClipConfig::default());
    let out = z.step(3.0);
    assert!(!out.spike && !out.clipped);
    assert_eq!(out.coefficient, 1.0);
    // mean = 0.5·2.5 + 0.5·3 = 2.75; var = 0.5·1.25 + 0.5·(3 − 2.75)² = 0.65625.
    assert_eq!(z.state.ema, Some((2.75, 0.65625)));
    // The detection boundary is where z = (g − μ) / (σ + eps) reaches 2.5.
    assert_close!(out.boundary, 5.295087471874737, 1e-15);
}

#[test]
fn zclip_spike_is_clipped_to_the_reciprocal_threshold_and_feeds_it_to_the_ema() {
    let mut z = zclip_started(ZClipConfig::default());
    let out = z.step(20.0);
    // z = 17.5 / (√1.25 + 1e-6) = 15.652461…; τ = μ + z_t² σ / z.
    let tau = 2.9464289707264246;
    assert!(out.spike && out.clipped);
    assert_close!(out.threshold, tau, 1e-14);
    assert_close!(out.coefficient, 0.14732144117024917, 1e-14);
    let (mean, var) = z.state.ema.unwrap();
    assert_close!(mean, 2.7232144853632123, 1e-14);
    assert_close!(var, 0.6499123532379819, 1e-13);
}

#[test]
fn zclip_options_mean_percentile_factor_and_skip() {
    let spike = 20.0;
    let mut mean = zclip_started(ZClipConfig {
        mode: ZMode::ZScore(ZClipTo::Mean),
        ..ZClipConfig::default()
    });
    let out = mean.step(spike);
    assert_eq!(out.threshold, 2.5);
    // The EMA sees the mean: the mean stays, the variance halves.
    assert_eq!(mean.state.ema, Some((2.5, 0.625)));

    let mut pct = zclip_started(ZClipConfig {
        mode: ZMode::Percentile,
        ..ZClipConfig::default()
    });
    let out = pct.step(spike);
    assert_close!(out.threshold, 2.5 + 2.5 * 1.25f64.sqrt(), 1e-15);
    assert_eq!(out.boundary, out.threshold);
    // Below μ + z σ nothing happens in percentile mode.
    assert!(!pct.step(3.0).clipped);

    let mut factor = zclip_started(ZClipConfig {
        clip_factor: 0.5,
        ..ZClipConfig::default()
    });
    assert_close!(
        factor.step(spike).threshold,
        2.9464289707264246 * 0.5,
        1e-14
    );

    let mut skip = zclip_started(ZClipConfig {
        skip_update_on_spike: true,
        ..ZClipConfig::default()
    });
    let out = skip.step(spike);
    assert!(out.clipped);
    assert_eq!(
        skip.state.ema,
        Some((2.5, 1.25)),
        "a spike left the EMA alone"
    );
    skip.step(3.0);
    assert_eq!(
        skip.state.ema,
        Some((2.75, 0.65625)),
        "a normal step still updates it"
    );
}

#[test]
fn zclip_cap_clips_during_warmup_and_bounds_the_threshold_but_not_the_ema() {
    let cap = ZClipConfig {
        max_norm: Some(1.5),
        ..ZClipConfig::default()
    };
    let mut z = ZClip::new(ZClipConfig {
        alpha: 0.5,
        warmup_steps: 4,
        ..cap
    });
    let out = z.step(1.0);
    assert_eq!(out.coefficient, 1.0);
    let out = z.step(2.0);
    assert!(out.clipped);
    assert_eq!(
        out.coefficient,
        1.5 / (2.0 + 1e-6),
        "torch's clip_grad_norm_ at the cap"
    );
    z.step(3.0);
    z.step(4.0);
    assert_eq!(
        z.state.ema,
        Some((2.5, 1.25)),
        "warm-up keeps the raw norms"
    );
    // No spike but above the cap: clipped to the cap, the EMA sees the raw norm.
    let out = z.step(3.0);
    assert!(!out.spike && out.clipped);
    assert_eq!(out.threshold, 1.5);
    assert_eq!(z.state.ema, Some((2.75, 0.65625)));
    // A spike: the cap wins the threshold, the EMA sees the adaptive value.
    let mut z = zclip_started(cap);
    let out = z.step(20.0);
    assert_eq!(out.threshold, 1.5);
    assert_close!(z.state.ema.unwrap().0, 2.7232144853632123, 1e-14);
}

#[test]
fn zclip_nonfinite_steps_leave_the_state_as_it_was() {
    let mut z = zclip(0.97, 3);
    z.step(1.0);
    let before = z.state.clone();
    for bad in [f64::NAN, f64::INFINITY] {
        let out = z.step(bad);
        assert!(out.skipped && !out.clipped);
        assert_eq!(z.state, before, "a warm-up step is not counted");
    }
    assert!(z.step(f64::NAN).coefficient.is_nan());
    assert_eq!(z.step(f64::INFINITY).coefficient, 0.0);
    z.step(2.0);
    z.step(3.0);
    assert_eq!(
        z.state.ema,
        Some((2.0, 2.0 / 3.0)),
        "started after 3 finite norms"
    );
    let before = z.state.clone();
    assert!(z.step(f64::NAN).skipped);
    assert_eq!(z.state, before);
}

#[test]
fn zclip_follows_a_slow_ramp_without_clipping() {
    // On a ramp of slope s the EMA settles a lag α s / (1 − α) behind with
    // σ equal to that lag, so z → 1/α < z_thresh: nothing is a spike.
    let mut z = zclip(0.97, 25);
    let s = 0.005;
    let lag = 0.97 * s / 0.03;
    let mut last = 0.0;
    for t in 0..400 {
        last = 1.0 + s * t as f64;
        let out = z.step(last);
        assert!(!out.clipped && !out.spike, "step {t} clipped a ramp");
    }
    let (mean, var) = z.state.ema.unwrap();
    assert!(
        (last - mean - lag).abs() < 0.01 * lag,
        "mean {mean} lags {last}"
    );
    assert!(
        (var.sqrt() - lag).abs() < 0.01 * lag,
        "σ {} vs lag {lag}",
        var.sqrt()
    );
}

#[test]
fn zclip_on_the_synthetic_sequence_catches_every_spike() {
    let norms = synthetic_norms(SYNTH_SEED);
    let mut z = ZClip::new(ZClipConfig::default());
    let outs: Vec<StepOut> = norms.iter().map(|&g| z.step(g)).collect();
    for &(t, _) in &SPIKES {
        assert!(
            outs[t].spike && outs[t].clipped,
            "spike at step {t}: {:?}",
            outs[t]
        );
        assert!(outs[t].coefficient < 0.5, "step {t}");
    }
    assert!(outs[NAN_STEP].skipped);
    // 5 % noise never reaches z = 2.5 here: the spikes and nothing else clip.
    let clipped: Vec<usize> = (0..SYNTH_STEPS).filter(|&t| outs[t].clipped).collect();
    assert_eq!(clipped, SPIKES.map(|(t, _)| t));
    // Every decision is far enough from its boundary for float32 to agree.
    let min = outs.iter().map(|o| o.margin).fold(f64::INFINITY, f64::min);
    assert!(min > 1e-2, "closest decision at relative distance {min:e}");
    // The EMA followed the drift: at the end the mean is near the level.
    let (mean, _) = z.state.ema.unwrap();
    assert!(
        close(mean, drift_level(SYNTH_STEPS - 1), 0.1),
        "mean {mean}"
    );
}

// ---------------------------------------------------------------- AutoClip

#[test]
fn percentile_is_numpys_linear_interpolation() {
    let x: Vec<f64> = (1..=10).map(f64::from).collect();
    assert_eq!(percentile_linear(&x, 0.0), 1.0);
    assert_close!(percentile_linear(&x, 10.0), 1.9, 1e-15);
    assert_close!(percentile_linear(&x, 25.0), 3.25, 1e-15);
    assert_eq!(percentile_linear(&x, 50.0), 5.5);
    assert_eq!(percentile_linear(&x, 100.0), 10.0);
    // numpy's documented example, unsorted: np.percentile([[10, 7, 4], [3, 2, 1]], 50) == 3.5.
    assert_eq!(
        percentile_linear(&[10.0, 7.0, 4.0, 3.0, 2.0, 1.0], 50.0),
        3.5
    );
    assert_eq!(percentile_linear(&[4.0], 37.0), 4.0);
}

#[test]
fn autoclip_includes_this_steps_norm_as_the_papers_code_does() {
    let mut with = AutoClip::new(AutoClipConfig::paper(50.0));
    let mut without = AutoClip::new(AutoClipConfig {
        include_current: false,
        ..AutoClipConfig::paper(50.0)
    });
    // First step: the paper clips to its own norm (by torch's 1e-6), the
    // package has no history yet and leaves it alone.
    let first = with.step(1.0);
    assert_eq!(first.threshold, 1.0);
    assert!(!first.clipped);
    assert_eq!(first.coefficient, 1.0 / (1.0 + 1e-6));
    let first = without.step(1.0);
    assert_eq!(first.threshold, f64::INFINITY);
    assert_eq!(first.coefficient, 1.0);
    for g in [2.0, 3.0] {
        with.step(g);
        without.step(g);
    }
    let out = with.step(10.0);
    assert_eq!(out.threshold, 2.5, "median of 1, 2, 3, 10");
    assert!(out.clipped);
    assert_eq!(out.coefficient, 2.5 / (10.0 + 1e-6));
    assert_eq!(without.step(10.0).threshold, 2.0, "median of 1, 2, 3");
    assert_eq!(
        with.history,
        vec![1.0, 2.0, 3.0, 10.0],
        "raw norms are kept"
    );
}

#[test]
fn autoclip_window_forgets_the_oldest_and_nonfinite_norms_are_not_kept() {
    let mut a = AutoClip::new(AutoClipConfig {
        window: Some(3),
        ..AutoClipConfig::paper(0.0)
    });
    for g in [1.0, 2.0, 3.0, 4.0] {
        a.step(g);
    }
    assert_eq!(a.history, vec![2.0, 3.0, 4.0]);
    let out = a.step(f64::NAN);
    assert!(out.skipped && out.coefficient.is_nan());
    assert_eq!(out.threshold, 2.0, "the threshold the history gives");
    assert_eq!(a.step(f64::INFINITY).coefficient, 0.0);
    assert_eq!(a.history, vec![2.0, 3.0, 4.0]);
    assert_eq!(a.steps, 4);
}

#[test]
fn autoclip_window_follows_a_drift() {
    // The median of the last 50 norms of a ramp is 24.5 steps behind.
    let mut a = AutoClip::new(AutoClipConfig {
        window: Some(50),
        ..AutoClipConfig::paper(50.0)
    });
    for t in 0..300 {
        let g = 1.0 + 0.01 * t as f64;
        let out = a.step(g);
        if t >= 49 {
            assert_close!(out.threshold, g - 0.245, 1e-12);
        }
    }
}

#[test]
fn autoclip_on_the_synthetic_sequence_clips_every_spike() {
    let norms = synthetic_norms(SYNTH_SEED);
    let mut a = AutoClip::new(AutoClipConfig {
        window: Some(100),
        ..AutoClipConfig::paper(90.0)
    });
    let outs: Vec<StepOut> = norms.iter().map(|&g| a.step(g)).collect();
    for &(t, f) in &SPIKES {
        assert!(outs[t].clipped, "spike at step {t}");
        assert!(
            outs[t].coefficient < 2.0 / f,
            "step {t}: {}",
            outs[t].coefficient
        );
    }
    assert!(outs[NAN_STEP].skipped);
    assert_eq!(a.steps, SYNTH_STEPS as u64 - 1);
    assert!(!a.history.iter().any(|g| g.is_nan()));
    // The level falls, so after the first few steps (a short history) this
    // step's norm is above the window's 90th percentile only on a spike.
    for (t, o) in outs.iter().enumerate().skip(10) {
        let spike = SPIKES.iter().any(|&(s, _)| s == t);
        assert_eq!(o.clipped, spike, "step {t}");
    }
    let min = outs.iter().map(|o| o.margin).fold(f64::INFINITY, f64::min);
    assert!(min > 1e-4, "closest decision at relative distance {min:e}");
    for (t, o) in outs.iter().enumerate().filter(|(_, o)| !o.skipped) {
        assert!(
            o.threshold < 1.5 * drift_level(t),
            "step {t}: {}",
            o.threshold
        );
    }
}

#[test]
fn bucketed_percentile_stays_within_its_bound() {
    let mut rng = Rng::new(7);
    for m in [4, 8, 12] {
        for trial in 0..20 {
            let n = 1 + trial * 37;
            // Norms over many binades.
            let v: Vec<f64> = (0..n)
                .map(|_| (rng.uniform() * 40.0 - 20.0).exp2())
                .collect();
            let exact32: Vec<f64> = v.iter().map(|&x| x as f32 as f64).collect();
            for p in [0.0, 10.0, 50.0, 90.0, 99.0, 100.0] {
                let exact = percentile_linear(&exact32, p);
                let got = percentile_bucketed(&v, p, m);
                let bound = exact * (-(m as f64)).exp2();
                assert!(
                    got <= exact && exact - got <= bound,
                    "m {m} n {n} p {p}: {got} vs {exact}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------- AdaGC

fn adagc(warmup: u64, tensors: usize) -> AdaGc {
    AdaGc::new(
        AdaGcConfig {
            warmup_steps: warmup,
            ..AdaGcConfig::default()
        },
        tensors,
    )
}

#[test]
fn adagc_warmup_clips_globally_and_keeps_each_tensors_smallest_clipped_norm() {
    let mut a = adagc(2, 2);
    let out = a.step(&[3.0, 4.0]);
    assert!(out.warmup && !out.skipped);
    assert_eq!(out.total_norm, 5.0);
    let c = 1.0 / (5.0 + 1e-6);
    for t in &out.tensors {
        assert_eq!(t.coefficient, c);
        assert_eq!(t.threshold, 1.0);
        assert!(t.clipped);
    }
    assert_eq!(a.gamma, vec![Some(3.0 * c), Some(4.0 * c)]);
    let out = a.step(&[0.3, 0.4]);
    assert_eq!(out.tensors[0].coefficient, 1.0);
    assert_eq!(
        a.gamma,
        vec![Some(0.3), Some(0.4)],
        "the minimum over warm-up"
    );
}

#[test]
fn adagc_clips_each_tensor_to_its_own_ema_and_feeds_the_clipped_norm_back() {
    let mut a = adagc(2, 2);
    a.step(&[3.0, 4.0]);
    a.step(&[0.3, 0.4]);
    let out = a.step(&[0.3, 10.0]);
    assert!(!out.warmup);
    let (t0, t1) = (&out.tensors[0], &out.tensors[1]);
    assert_close!(t0.threshold, 0.312, 1e-15);
    assert!(!t0.clipped);
    assert_eq!(t0.coefficient, 1.0);
    assert_close!(t1.threshold, 0.416, 1e-15);
    assert!(t1.clipped);
    assert_close!(t1.coefficient, 0.416 / (10.0 + 1e-6), 1e-15);
    // γ ← 0.99 γ + 0.01 · (clipped norm).
    assert_close!(a.gamma[0].unwrap(), 0.3, 1e-15);
    assert_close!(a.gamma[1].unwrap(), 0.99 * 0.4 + 0.01 * 0.416, 1e-15);
}

#[test]
fn adagc_nonfinite_steps_change_nothing_and_do_not_count() {
    let mut a = adagc(2, 2);
    a.step(&[3.0, 4.0]);
    let gamma = a.gamma.clone();
    let out = a.step(&[f64::NAN, 1.0]);
    assert!(out.skipped && out.warmup);
    assert!(
        out.tensors[1].coefficient.is_nan(),
        "warm-up: the global clip spreads NaN"
    );
    assert_eq!((a.gamma.clone(), a.steps), (gamma, 1));
    a.step(&[0.3, 0.4]);
    assert_eq!(a.steps, 2);
    let gamma = a.gamma.clone();
    let out = a.step(&[0.3, f64::INFINITY]);
    assert!(out.skipped && !out.warmup);
    assert_eq!(
        out.tensors[0].coefficient, 1.0,
        "a finite tensor keeps its own coefficient"
    );
    assert_eq!(out.tensors[1].coefficient, 0.0);
    assert_eq!((a.gamma.clone(), a.steps), (gamma, 2));
}

#[test]
fn adagc_without_warmup_starts_each_ema_at_the_first_norm() {
    let mut a = adagc(0, 2);
    let out = a.step(&[2.0, 5.0]);
    assert!(!out.warmup);
    assert!(out
        .tensors
        .iter()
        .all(|t| !t.clipped && t.coefficient == 1.0));
    assert_eq!(a.gamma, vec![Some(2.0), Some(5.0)]);
}

#[test]
fn adagc_zero_norm_during_warmup_pins_a_tensor_to_zero_as_the_authors_code_does() {
    // A tensor with no gradient in one warm-up step (an unused expert) keeps
    // γ = 0, and from then on every gradient it gets is multiplied by 0.
    // docs/adaptive.md lists this as an open question.
    let mut a = adagc(2, 2);
    a.step(&[0.5, 0.0]);
    a.step(&[0.5, 0.6]);
    assert_eq!(a.gamma[1], Some(0.0));
    for _ in 0..3 {
        let out = a.step(&[0.5, 0.6]);
        assert_eq!(out.tensors[1].coefficient, 0.0);
    }
    assert_eq!(a.gamma[1], Some(0.0));
}

#[test]
fn adagc_thresholds_grow_slowly_after_a_warmup_that_clipped_hard() {
    // With the authors' λ_abs = 1 and norms near 4, warm-up clips by ~0.25
    // and γ starts there; afterwards γ can grow by at most a factor
    // β + (1 − β) λ_rel = 1.0004 a step, so every tensor stays clipped.
    let norms = synthetic_tensor_norms(SYNTH_SEED);
    let mut a = AdaGc::new(AdaGcConfig::default(), TENSOR_SCALES.len());
    let mut prev = a.gamma.clone();
    for (t, n) in norms.iter().enumerate() {
        let out = a.step(n);
        if t >= 100 && !out.skipped {
            assert!(out.tensors.iter().all(|o| o.clipped), "step {t}");
            for (g, p) in a.gamma.iter().zip(&prev) {
                assert!(g.unwrap() <= p.unwrap() * (0.99 + 0.01 * 1.04) * (1.0 + 1e-15));
            }
        }
        prev = a.gamma.clone();
    }
}

#[test]
fn adagc_on_the_synthetic_norms_clips_spikes_per_tensor_and_follows_the_drift() {
    // λ_abs above every warm-up total, so γ starts from the raw norms.
    let cfg = AdaGcConfig {
        lambda_abs: 10.0,
        ..AdaGcConfig::default()
    };
    let norms = synthetic_tensor_norms(SYNTH_SEED);
    let mut a = AdaGc::new(cfg, TENSOR_SCALES.len());
    let outs: Vec<AdaGcStep> = norms.iter().map(|n| a.step(n)).collect();
    assert!(outs[..100]
        .iter()
        .all(|o| o.warmup && !o.tensors[0].clipped));
    assert!(outs[100..].iter().all(|o| !o.warmup));
    for &(t, i, f) in &TENSOR_SPIKES {
        let o = &outs[t].tensors[i];
        assert!(o.clipped, "tensor {i} at step {t}");
        assert!(
            o.coefficient < 1.5 / f,
            "tensor {i} at step {t}: {}",
            o.coefficient
        );
    }
    // A spike in one tensor leaves the others (nearly) alone.
    for i in [0, 2, 3] {
        assert!(outs[130].tensors[i].coefficient > 0.9, "tensor {i}");
    }
    assert!(outs[NAN_STEP].skipped);
    assert_eq!(a.steps, SYNTH_STEPS as u64 - 1);
    // γ is an EMA with β = 0.99: it follows the falling level about
    // β / (1 − β) = 99 steps behind.
    let behind = drift_level(SYNTH_STEPS - 1 - 99);
    for (i, g) in a.gamma.iter().enumerate() {
        let ratio = g.unwrap() / (TENSOR_SCALES[i] * behind);
        assert!(
            (0.95..1.05).contains(&ratio),
            "tensor {i}: γ / level = {ratio}"
        );
    }
    let min = outs
        .iter()
        .flat_map(|o| o.tensors.iter().map(|t| t.margin))
        .fold(f64::INFINITY, f64::min);
    assert!(min > 1e-4, "closest decision at relative distance {min:e}");
}

// ---------------------------------------------------------------- AGC

#[test]
fn unit_axes_follow_optax_and_pytorch_conventions() {
    let optax = |s: &[usize]| unit_axes(s, &Units::Optax);
    assert_eq!(optax(&[6]), Ok(vec![0]));
    assert_eq!(
        optax(&[1, 5]),
        Ok(vec![0, 1]),
        "squeezes to a vector: one unit"
    );
    assert_eq!(optax(&[5, 1]), Ok(vec![0, 1]));
    assert_eq!(optax(&[4, 3]), Ok(vec![0]), "IO: one unit per output");
    assert_eq!(optax(&[2, 3, 4]), Ok(vec![0]));
    assert_eq!(optax(&[3, 3, 2, 4]), Ok(vec![0, 1, 2]), "HWIO");
    assert_eq!(optax(&[1, 1, 4, 3]), Ok(vec![0, 1, 2]));
    assert!(optax(&[2, 2, 2, 2, 2]).is_err());
    let torch = |s: &[usize]| unit_axes(s, &Units::Torch);
    assert_eq!(torch(&[6]), Ok(vec![0]));
    assert_eq!(torch(&[3, 4]), Ok(vec![1]), "OI: one unit per row");
    assert_eq!(torch(&[4, 2, 3, 3]), Ok(vec![1, 2, 3]), "OIHW");
    assert_eq!(unit_axes(&[2, 3], &Units::Axes(vec![1, 1])), Ok(vec![1]));
    assert!(unit_axes(&[2, 3], &Units::Axes(vec![2])).is_err());
}

#[test]
fn unit_views_place_every_element_in_its_unit() {
    let v = UnitView::of(&[4, 3], &[0]).unwrap();
    assert_eq!(v, UnitView { p: 1, r: 4, q: 3 });
    assert_eq!(
        (0..12).map(|e| v.unit_of(e)).collect::<Vec<_>>(),
        [0, 1, 2].repeat(4)
    );
    assert_eq!(
        UnitView::of(&[3, 3, 2, 4], &[0, 1, 2]),
        Some(UnitView { p: 1, r: 18, q: 4 })
    );
    assert_eq!(
        UnitView::of(&[4, 2, 3, 3], &[1, 2, 3]),
        Some(UnitView { p: 4, r: 18, q: 1 })
    );
    let mid = UnitView::of(&[2, 3, 4], &[1]).unwrap();
    assert_eq!(mid, UnitView { p: 2, r: 3, q: 4 });
    assert_eq!(mid.unit_of(13), 5, "(p 1, r 0, q 1)");
    assert_eq!(
        UnitView::of(&[2, 3, 4], &[0, 2]),
        None,
        "not one run of axes"
    );
}

#[test]
fn agc_dense_io_by_hand_with_a_zero_weight_unit() {
    // Columns are units: w = (3, 4) and (0, 0); g = (0.3, 0.4) and (1e-3, 0).
    let param = Tensor::new(&[2, 2], vec![3.0, 0.0, 4.0, 0.0]);
    let grad = Tensor::new(&[2, 2], vec![0.3, 1e-3, 0.4, 0.0]);
    let out = agc_optax(&grad, &param, 0.05, 1e-3, &[0]);
    let (u0, u1) = (&out.units[0], &out.units[1]);
    assert_close!(u0.param_norm, 5.0, 1e-15);
    assert_close!(u0.max_norm, 0.25, 1e-15);
    assert!(u0.clipped);
    assert_close!(u0.factor, 0.5, 1e-7);
    assert_eq!(u1.param_norm, 0.0);
    assert_eq!(
        u1.max_norm,
        0.05 * 1e-3,
        "eps stands in for a zero weight norm"
    );
    assert_close!(u1.factor, 0.05, 1e-7);
    let want = [0.15, 5e-5, 0.2, 0.0];
    for (g, w) in out.grad.iter().zip(want) {
        assert_close!(*g, w, 1e-7);
    }
}

#[test]
fn agc_conv_hwio_by_hand() {
    // [H=1, W=2, I=1, O=2]: unit o holds elements o and 2 + o.
    let param = Tensor::new(&[1, 2, 1, 2], vec![3.0, 1.0, 4.0, 1.0]);
    let grad = Tensor::new(&[1, 2, 1, 2], vec![0.6, 0.01, 0.8, 0.01]);
    let axes = unit_axes(&param.shape, &Units::Optax).unwrap();
    let out = agc_optax(&grad, &param, 0.05, 1e-3, &axes);
    assert_eq!(out.units.len(), 2);
    assert!(out.units[0].clipped, "‖g‖ 1.0 > 0.05 · 5");
    assert!(!out.units[1].clipped, "‖g‖ 0.0141 < 0.05 · 1.414");
    let want = [0.15, 0.01, 0.2, 0.01];
    for (g, w) in out.grad.iter().zip(want) {
        assert_close!(*g, w, 1e-7);
    }
    assert_eq!(
        out.grad[1], 0.01f32 as f64,
        "an unclipped unit is left bit for bit"
    );
}

#[test]
fn agc_pytorch_rows() {
    let param = Tensor::new(&[2, 3], vec![1.0, 2.0, 2.0, 0.0, 0.0, 0.0]);
    let grad = Tensor::new(&[2, 3], vec![0.0, 0.3, 0.4, 0.0, 0.0, 0.0]);
    let axes = unit_axes(&param.shape, &Units::Torch).unwrap();
    let out = agc_optax(&grad, &param, 0.1, 1e-3, &axes);
    assert_close!(out.units[0].factor, 0.3 / 0.5, 1e-7);
    assert!(!out.units[1].clipped, "a zero gradient is never clipped");
    assert_eq!(out.units[1].factor, 1.0);
    assert!(out.grad[3..].iter().all(|&g| g == 0.0));
}

#[test]
fn agc_view_path_agrees_bit_for_bit_with_optax_on_the_generated_cases() {
    let cases = agc_cases(SYNTH_SEED);
    let mut clipped = 0;
    let mut kept = 0;
    for case in &cases {
        let axes = unit_axes(&case.param.shape, &case.units).unwrap();
        let view = UnitView::of(&case.param.shape, &axes).unwrap();
        let a = agc_optax(&case.grad, &case.param, AGC_CLIPPING, AGC_EPS, &axes);
        let b = agc_view(&case.grad, &case.param, AGC_CLIPPING, AGC_EPS, view);
        assert_eq!(a, b, "{}", case.name);
        for (u, unit) in a.units.iter().enumerate() {
            // The promise: ‖g_unit‖ ≤ clipping · max(‖w_unit‖, eps) afterwards.
            let after = (0..case.grad.data.len())
                .filter(|&e| view.unit_of(e) == u)
                .map(|e| a.grad[e] * a.grad[e])
                .sum::<f64>()
                .sqrt();
            assert!(
                after <= unit.max_norm * (1.0 + 1e-12),
                "{} unit {u}",
                case.name
            );
            if unit.clipped {
                clipped += 1;
                assert_close!(after, unit.max_norm, 1e-12);
            } else {
                kept += 1;
            }
        }
        let units = a.units.len();
        if units > 1 || case.name == "bias" {
            assert_eq!(
                a.units[0].param_norm, 0.0,
                "{}: zero-weight unit",
                case.name
            );
            assert_eq!(a.units[0].max_norm, AGC_CLIPPING * AGC_EPS);
        }
        if units > 1 {
            let last = &a.units[units - 1];
            assert_eq!((last.grad_norm, last.factor), (0.0, 1.0), "{}", case.name);
        }
    }
    assert!(
        clipped >= 10 && kept >= 10,
        "{clipped} clipped, {kept} kept"
    );
}

#[test]
fn agc_nonfinite_units_go_nan_as_in_optax_and_leave_the_others() {
    let param = Tensor::new(&[2, 2], vec![1.0, 1.0, 1.0, 1.0]);
    let nan = Tensor::new(&[2, 2], vec![f32::NAN, 0.01, 0.5, 0.01]);
    let out = agc_optax(&nan, &param, 0.1, 1e-3, &[0]);
    assert!(out.grad[0].is_nan() && out.grad[2].is_nan());
    assert_eq!([out.grad[1], out.grad[3]], [0.01f32 as f64; 2]);
    let inf = Tensor::new(&[2, 2], vec![f32::INFINITY, 0.01, 0.5, 0.01]);
    let out = agc_optax(&inf, &param, 0.1, 1e-3, &[0]);
    assert!(out.grad[0].is_nan(), "inf × 0");
    assert_eq!(out.grad[2], 0.0, "finite × (max / inf) = 0");
    assert_eq!(out.grad[1], 0.01f32 as f64);
}

// ---------------------------------------------------------------- generators

#[test]
fn generators_are_deterministic_and_shaped_as_documented() {
    let a = synthetic_norms(SYNTH_SEED);
    let b = synthetic_norms(SYNTH_SEED);
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    assert_ne!(a[..10], synthetic_norms(SYNTH_SEED + 1)[..10]);
    assert_eq!(a.len(), SYNTH_STEPS);
    for (t, &g) in a.iter().enumerate() {
        let level = drift_level(t);
        match SPIKES.iter().find(|(s, _)| *s == t) {
            _ if t == NAN_STEP => assert!(g.is_nan()),
            Some(&(_, f)) => assert!(g >= 0.7 * f * level, "spike {t}"),
            None => assert!((0.7 * level..=1.3 * level).contains(&g), "step {t}: {g}"),
        }
    }
    let tn = synthetic_tensor_norms(SYNTH_SEED);
    for (t, step) in tn.iter().enumerate() {
        for (i, &n) in step.iter().enumerate() {
            assert_eq!(n.is_nan(), t == NAN_STEP && i == NAN_TENSOR);
        }
    }
    let mut rng = Rng::new(3);
    for target in [1e-20, 0.5, 3.0, 1e20] {
        let g = gradients_with_norm(&mut rng, 1000, target);
        let norm = g.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        assert_close!(norm, target, 1e-6);
    }
    assert!(gradients_with_norm(&mut rng, 10, f64::NAN)
        .iter()
        .any(|g| g.is_nan()));
    assert!(gradients_with_norm(&mut rng, 10, f64::INFINITY).contains(&f32::INFINITY));
    let cases = agc_cases(SYNTH_SEED);
    assert_eq!(cases.len(), 7);
    assert_eq!(
        format!("{:?}", cases),
        format!("{:?}", agc_cases(SYNTH_SEED))
    );
}
