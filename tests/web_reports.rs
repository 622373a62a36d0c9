//! gradclip's own device helper and its asynchronous reports in a browser:
//! `default_device` finds the WebGPU adapter without any environment, and
//! `read_report` resolves from the map callback of the latest submitted step
//! while earlier steps' reports are still in flight.
//!
//! `cargo test --target wasm32-unknown-unknown --test web_reports` (see docs/browser.md).
#![cfg(target_arch = "wasm32")]

use gradclip::{ClipNorm, Error, GradLayout};
use wasm_bindgen_test::{console_log, wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

#[allow(dead_code)]
mod common {
    pub mod buffers;
    pub mod web;
}

use common::web;

#[wasm_bindgen_test]
async fn default_device_and_async_reports() {
    let (device, queue, info) = gradclip::default_device().await.expect("default_device");
    console_log!("default_device: {info:?}");
    assert_eq!(info.backend, wgpu::Backend::BrowserWebGpu);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let clipper = gradclip::Clipper::new(&device, &queue).expect("Clipper::new");

    // 3 tensors, 50_000 elements: several chunks, g_i = (i mod 9) - 4.
    let sizes = [30_000, 7, 19_993];
    let grads: Vec<f32> = (0..50_000).map(|i| (i % 9) as f32 - 4.0).collect();
    let norm0 = grads
        .iter()
        .map(|&g| (g as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    let buffer = web::upload(&device, &grads);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&sizes).unwrap())
        .expect("bind");
    assert_eq!(set.read_report().await, Err(Error::NoReport));

    // Three steps submitted back to back, none awaited: the first clips the
    // norm to 2, the second to 1, the third finds 1 and leaves it.
    let limits = [2.0f32, 1.0, 1.0];
    for (k, &max_norm) in limits.iter().enumerate() {
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some(&format!("step {}", k + 1)),
        });
        set.clip_norm(&mut encoder, &ClipNorm::new(max_norm))
            .unwrap();
        queue.submit([encoder.finish()]);
    }
    let report = set.read_report().await.expect("report");
    console_log!("{report:?}");
    assert_eq!(report.step, 3);
    // Step 3 sees the norm that steps 1 and 2 left.
    let after1 = norm0 * (2.0 / (norm0 + 1e-6));
    let after2 = after1 * (1.0 / (after1 + 1e-6));
    assert!(
        ((report.total_norm as f64) - after2).abs() <= 1e-5 * after2,
        "total norm {} after two clips, want {after2}",
        report.total_norm
    );
    let coef = (1.0 / (after2 + 1e-6)).min(1.0);
    assert!(
        (report.coefficient as f64 - coef).abs() <= 1e-6,
        "coefficient {}, want {coef}",
        report.coefficient
    );
    // Asked again with nothing new submitted, the same report comes back.
    assert_eq!(set.read_report().await, Ok(report.clone()));

    // The gradients are the input scaled by the product of the coefficients.
    let clipped = web::download(&device, &queue, &buffer, grads.len()).await;
    let factor = after2 * report.coefficient as f64 / norm0;
    for (i, (&got, &g)) in clipped.iter().zip(&grads).enumerate() {
        let want = g as f64 * factor;
        assert!(
            (got as f64 - want).abs() <= 1e-5 * want.abs() + 1e-30,
            "element {i}: {got}, want {want}"
        );
    }

    // A step recorded but not yet submitted: the latest submitted report
    // stands (waiting for the unsubmitted step's map would never end), and
    // once submitted, its report is the latest.
    let mut pending = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("step 4, submitted late"),
    });
    set.clip_norm(&mut pending, &ClipNorm::new(1.0)).unwrap();
    assert_eq!(set.read_report().await.expect("report").step, 3);
    queue.submit([pending.finish()]);
    assert_eq!(set.read_report().await.expect("report").step, 4);
    // Every report of a run of steps, in order, without waiting in between.
    for _ in 0..5 {
        let mut encoder = device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
        queue.submit([encoder.finish()]);
    }
    let taken = set.take_reports().await.expect("reports");
    let steps: Vec<u64> = taken.reports.iter().map(|r| r.step).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(taken.dropped, 0);

    if let Some(e) = scope.pop().await {
        panic!("WebGPU validation error: {e}");
    }
}
