//! ZClip and AutoClip in a browser (WebGPU through Chromium's Dawn and Tint)
//! against the float64 references: the 500-step synthetic sequence, every
//! step's threshold, decision and applied coefficient.
//!
//! `cargo test --target wasm32-unknown-unknown --test adaptive_web` (see docs/browser.md).
#![cfg(target_arch = "wasm32")]

use gradclip::{AdaptiveClip, AdaptiveMethod, ClipNorm, GradLayout, Semantics};
use wasm_bindgen_test::{console_log, wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

#[allow(dead_code)]
mod common {
    pub mod adaptive_reference;
    pub mod buffers;
    pub mod web;
}

use common::adaptive_reference::{self as reference, Rng, StepOut};
use common::web;

const SIZES: [usize; 2] = [700, 324];
const TOL: f64 = 1e-5;
const EDGE: f64 = 1e-5;

fn same(got: f64, want: f64, tol: f64) -> bool {
    (got.is_nan() && want.is_nan())
        || got == want
        || (got - want).abs() <= tol * want.abs().max(f64::MIN_POSITIVE)
}

fn norm64(data: &[f32]) -> f64 {
    if data.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    data.iter()
        .map(|&x| x as f64 * x as f64)
        .sum::<f64>()
        .sqrt()
}

async fn run_against(method: AdaptiveMethod, mut reference: impl FnMut(f64) -> StepOut) {
    let gpu = web::gpu().await;
    let (device, queue) = (&gpu.device, &gpu.queue);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let clipper = gradclip::Clipper::new(device, queue).expect("Clipper::new");
    let len: usize = SIZES.iter().sum();
    let buffer = web::upload(device, &vec![0.0; len]);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&SIZES).unwrap())
        .expect("bind");
    let adaptive = AdaptiveClip::new(&set, method).expect("AdaptiveClip::new");
    let clip = ClipNorm::new(1.0);
    let targets = reference::synthetic_norms(reference::SYNTH_SEED);
    let mut rng = Rng::new(0x00ad_a971);
    let (mut clipped, mut on_edge) = (0, 0);
    for (t, &target) in targets.iter().enumerate() {
        let data = reference::gradients_with_norm(&mut rng, len, target);
        let want = reference(norm64(&data));
        queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&data));
        let mut encoder = device.create_command_encoder(&Default::default());
        adaptive.clip(&set, &mut encoder, &clip).expect("record");
        queue.submit([encoder.finish()]);
        let d = adaptive.read_decision().await.expect("decision");
        let report = match set.read_report().await {
            Ok(r) => r,
            // Say why: a WebGPU validation error leaves no report.
            Err(e) => panic!("report: {e:?}, scope: {:?}", scope.pop().await),
        };
        let ctx = format!(
            "step {t}: gpu {d:?} {}, reference {want:?}",
            report.coefficient
        );
        assert_eq!(d.skipped, want.skipped, "{ctx}");
        if want.margin > EDGE {
            assert_eq!((d.clipped, d.spike), (want.clipped, want.spike), "{ctx}");
        } else {
            on_edge += 1;
        }
        assert!(same(d.threshold as f64, want.threshold, TOL), "{ctx}");
        assert!(
            same(report.coefficient as f64, want.coefficient, TOL),
            "{ctx}"
        );
        if t % 50 == 0 {
            let after = web::download(device, queue, &buffer, len).await;
            for (&b, &a) in data.iter().zip(&after) {
                let expect = b as f64 * want.coefficient;
                assert!(
                    (expect.is_nan() && a.is_nan())
                        || (a as f64 - expect).abs() <= TOL * expect.abs() + 1e-30,
                    "{ctx}: {a} vs {expect}"
                );
            }
        }
        clipped += want.clipped as usize;
    }
    console_log!("{clipped} clipped steps, {on_edge} within {EDGE:e} of a boundary");
    assert!(clipped >= 3 && on_edge <= 5);
    assert!(scope.pop().await.is_none(), "a WebGPU validation error");
}

#[wasm_bindgen_test]
async fn zclip_follows_the_reference_in_the_browser() {
    let cfg = reference::ZClipConfig {
        semantics: Semantics::Torch,
        ..Default::default()
    };
    let mut z = reference::ZClip::new(cfg);
    run_against(gradclip::ZClip::new().into(), move |g| z.step(g)).await;
}

#[wasm_bindgen_test]
async fn autoclip_follows_the_reference_in_the_browser() {
    let mut a = reference::AutoClip::new(reference::AutoClipConfig::paper(10.0));
    run_against(gradclip::AutoClip::new(10.0).window(512).into(), move |g| {
        a.step(g)
    })
    .await;
}
