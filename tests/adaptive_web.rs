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

#[wasm_bindgen_test]
async fn adagc_follows_the_reference_in_the_browser() {
    let gpu = web::gpu().await;
    let (device, queue) = (&gpu.device, &gpu.queue);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let clipper = gradclip::Clipper::new(device, queue).expect("Clipper::new");
    let sizes = [400, 130, 64, 300];
    let len: usize = sizes.iter().sum();
    let buffer = web::upload(device, &vec![0.0; len]);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&sizes).unwrap())
        .expect("bind");
    let adaptive = AdaptiveClip::new(&set, gradclip::AdaGc::new()).expect("AdaGC");
    let mut want_ref = reference::AdaGc::new(reference::AdaGcConfig::default(), sizes.len());
    let mut rng = Rng::new(0x00ad_a6c0);
    for (t, targets) in reference::synthetic_tensor_norms(reference::SYNTH_SEED)
        .iter()
        .enumerate()
    {
        let mut data = Vec::new();
        let mut norms = Vec::new();
        for (&size, &target) in sizes.iter().zip(targets) {
            let part = reference::gradients_with_norm(&mut rng, size, target);
            norms.push(norm64(&part));
            data.extend(part);
        }
        let want = want_ref.step(&norms);
        queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&data));
        let mut encoder = device.create_command_encoder(&Default::default());
        adaptive
            .clip(&set, &mut encoder, &ClipNorm::new(1.0))
            .expect("record");
        queue.submit([encoder.finish()]);
        let tensors = adaptive.read_tensor_decisions().await.expect("decisions");
        for (i, (got, w)) in tensors.iter().zip(&want.tensors).enumerate() {
            let ctx = format!("step {t} tensor {i}: gpu {got:?}, reference {w:?}");
            assert!(same(got.threshold as f64, w.threshold, TOL), "{ctx}");
            assert!(same(got.coefficient as f64, w.coefficient, TOL), "{ctx}");
        }
        if t % 50 == 0 {
            let after = web::download(device, queue, &buffer, len).await;
            let mut start = 0;
            for (&size, w) in sizes.iter().zip(&want.tensors) {
                for (&b, &a) in data[start..start + size].iter().zip(&after[start..]) {
                    let expect = b as f64 * w.coefficient;
                    assert!(
                        (expect.is_nan() && a.is_nan())
                            || (a as f64 - expect).abs() <= TOL * expect.abs() + 1e-30,
                        "step {t}: {a} vs {expect}"
                    );
                }
                start += size;
            }
        }
    }
    assert!(scope.pop().await.is_none(), "a WebGPU validation error");
}

#[wasm_bindgen_test]
async fn agc_follows_optax_in_the_browser() {
    let gpu = web::gpu().await;
    let (device, queue) = (&gpu.device, &gpu.queue);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let cases = reference::agc_cases(1);
    let grads: Vec<f32> = cases.iter().flat_map(|c| c.grad.data.clone()).collect();
    let params: Vec<f32> = cases.iter().flat_map(|c| c.param.data.clone()).collect();
    let sizes: Vec<usize> = cases.iter().map(|c| c.grad.data.len()).collect();
    let grad_buffer = web::upload(device, &grads);
    let param_buffer = web::upload(device, &params);
    let shapes: Vec<(&[usize], gradclip::AgcUnits)> = cases
        .iter()
        .map(|c| {
            let units = match c.units {
                reference::Units::Torch => gradclip::AgcUnits::Torch,
                _ => gradclip::AgcUnits::Optax,
            };
            (c.grad.shape.as_slice(), units)
        })
        .collect();
    let agc = gradclip::AgcClip::new(
        device,
        queue,
        &grad_buffer,
        &param_buffer,
        &GradLayout::from_sizes(&sizes).unwrap(),
        &shapes,
        gradclip::Agc::new(reference::AGC_CLIPPING as f32).eps(reference::AGC_EPS as f32),
    )
    .expect("AgcClip::new");
    let mut encoder = device.create_command_encoder(&Default::default());
    agc.clip(&mut encoder).expect("record");
    queue.submit([encoder.finish()]);
    let after = web::download(device, queue, &grad_buffer, grads.len()).await;
    let mut start = 0;
    for c in &cases {
        let axes = reference::unit_axes(&c.grad.shape, &c.units).unwrap();
        let want = reference::agc_optax(
            &c.grad,
            &c.param,
            reference::AGC_CLIPPING,
            reference::AGC_EPS,
            &axes,
        );
        for (i, &w) in want.grad.iter().enumerate() {
            let a = after[start + i] as f64;
            assert!(
                (a - w).abs() <= TOL * w.abs() + 1e-30,
                "{}: {a} vs {w}",
                c.name
            );
        }
        start += c.grad.data.len();
    }
    assert!(scope.pop().await.is_none(), "a WebGPU validation error");
}
