//! The 24 golden cases in a browser: WebGPU through wgpu's `webgpu` back end,
//! shaders compiled by Tint (which, unlike naga, enforces WGSL's uniformity
//! analysis), WebGPU's default limits, `map_async` readbacks only.
//!
//! `cargo test --target wasm32-unknown-unknown --test web_golden` with
//! wasm-bindgen-test-runner and chromedriver set up (see docs/browser.md).
//! Browser tests live one per binary: a panic aborts the whole wasm instance.
#![cfg(target_arch = "wasm32")]

use wasm_bindgen_test::{console_log, wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

#[allow(dead_code)]
mod common {
    pub mod buffers;
    pub mod checks;
    pub mod golden;
    pub mod reference;
    pub mod web;
}

use common::checks::{verify, Op};
use common::golden::cases;
use common::web;

#[wasm_bindgen_test]
async fn all_24_golden_cases_in_the_browser() {
    let gpu = web::gpu().await;
    console_log!("adapter: {:?}", gpu.info);
    // Errors of pipeline creation (a shader Tint rejects, say) arrive
    // asynchronously in the browser: catch them all in one scope.
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let clipper = gradclip::Clipper::new(&gpu.device, &gpu.queue).expect("Clipper::new");
    assert_eq!(clipper.workgroup_size(), 256);
    if let Some(e) = scope.pop().await {
        panic!("WebGPU rejected gradclip's pipelines: {e}");
    }
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);

    let cases = cases();
    assert_eq!(cases.len(), 24, "golden case count");
    for case in &cases {
        let buffer = web::upload(&gpu.device, &case.grads);
        let layout = gradclip::GradLayout::from_sizes(&case.sizes).expect("layout");
        let set = clipper.bind(&buffer, &layout).expect("bind");
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some(&case.name),
            });
        Op::of(case).record(&set, &mut encoder).expect("record");
        gpu.queue.submit([encoder.finish()]);
        let report = set.read_report().await;
        let clipped = web::download(&gpu.device, &gpu.queue, &buffer, case.grads.len()).await;
        verify(case, report, &clipped);
        console_log!("ok   {} {}", case.kind, case.name);
    }
    if let Some(e) = scope.pop().await {
        panic!("WebGPU validation error: {e}");
    }
}
