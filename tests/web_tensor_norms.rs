//! Per-tensor norms in a browser, where the reduce pass runs the GPU shape
//! (teams of eight lanes, chunks of 32 768 elements) that the native suite's
//! CPU adapters do not: layouts whose chunks the flat walk tracks in rounds
//! (reduce.wgsl, tracked_round), with segment ends at every place in a
//! team's blocks, one whose short tensors leave chunks untracked, and one
//! with runs of one-element tensors; L2, Inf and a general p (and an
//! integer p for the runs), and a tensor alone of more chunks than a
//! workgroup has invocations (long_tensor_stats), and one of fewer
//! (tensor_stats' fold of 16-share groups). Each tensor's norm against
//! float64, and the global norm's bits against the same clip without
//! per-tensor results (and the lone tensors' own against them).
//!
//! `cargo test --target wasm32-unknown-unknown --test web_tensor_norms` (see
//! docs/browser.md). Browser tests live one per binary: a panic aborts the
//! whole wasm instance.
#![cfg(target_arch = "wasm32")]

use gradclip::{ClipNorm, ClipReport, GradLayout};
use wasm_bindgen_test::{console_log, wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

#[allow(dead_code)]
mod common {
    pub mod adaptive_reference;
    pub mod buffers;
    pub mod layouts;
    pub mod reference;
    pub mod web;
}

use common::adaptive_reference::Rng;
use common::reference::{self, Order};
use common::web;

/// A draw from the tests' shared generator in [0, n).
fn below(rng: &mut Rng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// `count` tensor sizes: mostly one block (128 elements on GPUs) to a few
/// thousand, with exact blocks and a block plus or minus one among them;
/// with `short`, some of 0 to 127 elements too.
fn sizes(rng: &mut Rng, count: usize, short: bool) -> Vec<usize> {
    (0..count)
        .map(|_| match below(rng, if short { 8 } else { 7 }) {
            0 => [128, 129, 255, 256, 257, 384][below(rng, 6) as usize],
            1..=4 => 128 + below(rng, 600) as usize,
            5 => 600 + below(rng, 4000) as usize,
            6 => 4600 + below(rng, 20_000) as usize,
            _ => below(rng, 128) as usize,
        })
        .collect()
}

/// Each tensor's elements at its own scale, 2^-60 to 2^60, signs mixed.
fn fill(rng: &mut Rng, sizes: &[usize]) -> Vec<f32> {
    let mut data = Vec::with_capacity(sizes.iter().sum());
    for &n in sizes {
        let scale = 2f32.powi(below(rng, 121) as i32 - 60);
        data.extend((0..n).map(|_| {
            let unit = rng.uniform() as f32 * 2.0 - 1.0;
            unit * scale
        }));
    }
    data
}

async fn report(gpu: &web::Gpu, set: &gradclip::GradSet, clip: &ClipNorm) -> ClipReport {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, clip).expect("clip_norm");
    gpu.queue.submit([encoder.finish()]);
    set.read_report().await.expect("report")
}

#[wasm_bindgen_test]
async fn tensor_norms_of_tracked_and_untracked_chunks_match_float64() {
    let gpu = web::gpu().await;
    console_log!("adapter: {:?}", gpu.info);
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let clipper = gradclip::Clipper::new(&gpu.device, &gpu.queue).expect("Clipper::new");
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for layout in 0..4 {
        let sizes = match layout {
            // Runs of one-element tensors starting at each place in a
            // quad, the longest over three chunks.
            3 => common::layouts::unit_runs(
                &[(5, 600), (2, 3), (7001, 70_000), (3, 2), (129, 9)],
                1000,
            ),
            _ => sizes(&mut rng, 700, layout == 2),
        };
        let data = fill(&mut rng, &sizes);
        let buffer = web::upload(&gpu.device, &data);
        let set = clipper
            .bind(&buffer, &GradLayout::from_sizes(&sizes).unwrap())
            .expect("bind");
        // A general p too: its tracked walk keeps two-word slots
        // (reduce.wgsl, p_slot), half as many segments a chunk.
        let orders: &[Order] = match layout {
            // An integer p too: with L2 and Inf, its flat walk gives a unit
            // run's tensors their results (reduce_flat_units).
            3 => &[Order::L2, Order::Inf, Order::P(1.5), Order::P(3.0)],
            _ => &[Order::L2, Order::Inf, Order::P(1.5)],
        };
        for &order in orders {
            let what = format!("layout {layout} ({} elements), {order:?}", data.len());
            // A threshold far above the norm: no step changes the data.
            let clip = ClipNorm::new(f32::MAX).norm(order.to_norm());
            let plain = report(&gpu, &set, &clip).await;
            let logged = report(&gpu, &set, &clip.tensor_norms(true)).await;
            assert_eq!(
                plain.total_norm.to_bits(),
                logged.total_norm.to_bits(),
                "{what}: tensor_norms moved the global norm"
            );
            reference::assert_tensor_norms(&logged.tensor_norms, &data, &sizes, order, 1e-5, &what);
            console_log!(
                "{what}: {} tensor norms within 1e-5 of float64",
                sizes.len()
            );
        }
    }
    // A tensor of more chunks than a workgroup has invocations: a
    // workgroup of long_tensor_stats folds its partials, in finalize's
    // order, so alone in its layout it gets the global norm's bits.
    let wg = clipper.workgroup_size() as usize;
    let n = (wg + 2) * 32768 + 7;
    let data = fill(&mut rng, &[n]);
    let buffer = web::upload(&gpu.device, &data);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&[n]).unwrap())
        .expect("bind");
    let chunk = set.chunk_elements() as usize;
    assert!(
        n / chunk > wg,
        "chunks of {chunk}: not long for workgroups of {wg}"
    );
    for order in [Order::L2, Order::Inf, Order::P(1.5)] {
        let what = format!("one tensor of {n} elements, {order:?}");
        let clip = ClipNorm::new(f32::MAX).norm(order.to_norm());
        let plain = report(&gpu, &set, &clip).await;
        let logged = report(&gpu, &set, &clip.tensor_norms(true)).await;
        assert_eq!(
            (
                logged.tensor_norms[0].to_bits(),
                logged.total_norm.to_bits()
            ),
            (plain.total_norm.to_bits(), plain.total_norm.to_bits()),
            "{what}: the tensor's norm against the global one"
        );
        reference::assert_tensor_norms(&logged.tensor_norms, &data, &[n], order, 1e-5, &what);
        console_log!("{what}: the global norm's bits, within 1e-5 of float64");
    }
    // A tensor of 20 chunks, on the split list: tensor_stats folds its
    // partials on one invocation in finalize's order, groups of 16 then
    // the groups; in that order four of the spikes' 1s stay.
    let spikes = common::layouts::spiked_chunks(20, chunk);
    let buffer = web::upload(&gpu.device, &spikes);
    let set = clipper
        .bind(&buffer, &GradLayout::from_sizes(&[spikes.len()]).unwrap())
        .expect("bind");
    assert_eq!(set.chunk_elements() as usize, chunk, "the chunk size moved");
    let clip = ClipNorm::new(f32::MAX);
    let plain = report(&gpu, &set, &clip).await;
    let logged = report(&gpu, &set, &clip.tensor_norms(true)).await;
    assert!(
        plain.total_norm > 4096.0,
        "20 spiked chunks: the 1s must not all round away in the global fold"
    );
    assert_eq!(
        logged.tensor_norms[0].to_bits(),
        plain.total_norm.to_bits(),
        "20 spiked chunks: the tensor's norm against the global one ({:e}, {:e})",
        logged.tensor_norms[0],
        plain.total_norm
    );
    console_log!("a tensor of 20 spiked chunks: the global norm's bits");
    if let Some(e) = scope.pop().await {
        panic!("WebGPU validation error: {e}");
    }
}
