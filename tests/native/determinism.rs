//! Determinism across options and element paths (issue 9, item 12): the
//! global norm, its partial and the clipped gradients have the same bits
//! whether or not a clip asks for per-tensor norms or per-tensor clipping,
//! and f16 gradients give the same bits on the native (`shader-f16`) and the
//! packed path, per-tensor norms and per-tensor clips included.

use crate::common;

use common::{assert_no_wgpu_errors, gpu, layouts};
use gradclip::{ClipNorm, ClipReport, Clipper, ElementPath, GradLayout, GradType, Norm};

/// Layout 0: odd lengths, tensors that straddle chunk boundaries (32768
/// elements) and runs of tiny tensors, so that per-tensor and flat cuts of
/// the elements differ everywhere.
const FIXED: [usize; 12] = [1, 3, 1000, 40_001, 7, 70_000, 2, 5003, 1, 33_333, 64, 9];

/// Layout 1: runs of one-element tensors, each `(lead, run)` after a
/// tensor of `lead` elements, starting at several places in a quad, the
/// last across a chunk boundary on every device (element 131 072: chunks
/// of 131 072 elements on CPU adapters, 32 768 on others). The reduce pass
/// gives a chunk's longest run its tensors' results during its flat walk
/// (reduce.wgsl, reduce_flat_units and for a general p
/// reduce_flat_units_p), which must add the same terms in the
/// same order as a walk without them. Whether another order shows in the
/// global bits depends on the data: with these values a swap of two
/// accumulators in that walk did, where runs of 20 000 and 9 000 did not.
const UNIT_RUNS: [(usize, usize); 5] = [(5, 600), (2, 3), (7001, 40_000), (3, 2), (83_001, 9_000)];

/// Layouts 2.. have a few tensors of random sizes and random values: a
/// rounding that depends on how the elements are cut shows in some of them.
const SEEDS: u64 = 8;

const NORMS: [Norm; 4] = [Norm::L2, Norm::Inf, Norm::P(3.0), Norm::L1];

/// The norms of the f16 paths' comparison: each walk once. The two paths
/// differ only in how they load and widen elements, and an integer p's
/// walks are the same code for every power (L1 is p = 1), but each power
/// is a pipeline of its own on each path: L1's per-tensor pipelines took
/// about 70 of the comparison's 245 s on lavapipe, compiling.
const F16_NORMS: [Norm; 3] = [Norm::L2, Norm::Inf, Norm::P(3.0)];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Deterministic values spread over 24 binades, a few below Blue's medium
/// band (its small bin). None above it: one such element would dominate the
/// sum and hide every rounding of the others, whose order is the point.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    (0..n)
        .map(|i| {
            let r = rng.next();
            let mant = 1.0 + (r >> 40) as f32 / (1u64 << 24) as f32;
            let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
            let exp = match i % 997 {
                0 => -70, // below 2^-63: the small bin
                _ => ((r >> 8) % 24) as i32 - 12,
            };
            sign * mant * 2f32.powi(exp)
        })
        .collect()
}

/// The sizes of layout `seed`: FIXED for 0, UNIT_RUNS and a tensor of
/// 33 001 for 1, else 2 to 6 tensors of 1 to 60 000 elements.
fn sizes(seed: u64) -> Vec<usize> {
    match seed {
        0 => FIXED.to_vec(),
        1 => layouts::unit_runs(&UNIT_RUNS, 33_001),
        _ => {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let n = 2 + rng.next() % 5;
            (0..n).map(|_| 1 + (rng.next() % 60_000) as usize).collect()
        }
    }
}

/// One clip on a fresh buffer holding `bytes`: the report and the buffer's
/// words afterwards.
fn clip_once(
    clipper: &Clipper,
    layout: &GradLayout,
    ty: GradType,
    bytes: &[u8],
    clip: &ClipNorm,
) -> (ClipReport, Vec<u32>) {
    let g = gpu();
    clip_on(&g.device, &g.queue, clipper, layout, ty, bytes, clip)
}

/// [`clip_once`] on a device of the test's own (`clipper` is that device's).
fn clip_on(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    clipper: &Clipper,
    layout: &GradLayout,
    ty: GradType,
    bytes: &[u8],
    clip: &ClipNorm,
) -> (ClipReport, Vec<u32>) {
    let buf = common::buffers::upload_bytes(device, bytes);
    let set = clipper.bind_as(&buf, layout, ty).unwrap();
    let mut encoder = device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, clip).unwrap();
    queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();
    let floats = common::download_all(device, queue, &buf);
    assert_no_wgpu_errors();
    (report, bits(&floats))
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// The global results of a report: the norm, the factor and the partial.
fn global(r: &ClipReport) -> (u32, u32, [u8; 16]) {
    (
        r.total_norm.to_bits(),
        r.coefficient.to_bits(),
        r.partial.to_bytes(),
    )
}

/// Asserts that two clips gave the same bits: the global results, every
/// tensor's norm and factor, and the gradients' words afterwards.
fn assert_same_clip(a: (&ClipReport, &[u32]), b: (&ClipReport, &[u32]), what: &str) {
    assert_eq!(global(a.0), global(b.0), "{what}: global results differ");
    assert_eq!(
        bits(&a.0.tensor_norms),
        bits(&b.0.tensor_norms),
        "{what}: per-tensor norms differ"
    );
    assert_eq!(
        bits(&a.0.tensor_coefficients),
        bits(&b.0.tensor_coefficients),
        "{what}: per-tensor factors differ"
    );
    // Not assert_eq: a million words' difference would bury the message.
    assert!(a.1 == b.1, "{what}: clipped gradients differ");
}

#[test]
fn global_norm_ignores_per_tensor_options() {
    let g = gpu();
    for seed in 0..SEEDS {
        let sizes = sizes(seed);
        let layout = GradLayout::from_sizes(&sizes).unwrap();
        // A general p too: its unit runs' walk (reduce_flat_units_p) is
        // one of its own.
        for norm in [NORMS.as_slice(), &[Norm::P(1.5)]].concat() {
            let data = values(sizes.iter().sum(), seed);
            let bytes: &[u8] = bytemuck::cast_slice(&data);
            // A max norm well below the total: every option clips.
            let base = ClipNorm::new(1e-3).norm(norm);
            let (plain, plain_grads) = clip_once(&g.clipper, &layout, GradType::F32, bytes, &base);
            let (logged, logged_grads) = clip_once(
                &g.clipper,
                &layout,
                GradType::F32,
                bytes,
                &base.tensor_norms(true),
            );
            let (per_tensor, _) = clip_once(
                &g.clipper,
                &layout,
                GradType::F32,
                bytes,
                &base.per_tensor(true),
            );
            assert!(plain.coefficient < 1.0, "{norm:?}: the clip must scale");
            assert_eq!(
                global(&plain),
                global(&logged),
                "layout {seed} {norm:?}: tensor_norms(true) moved the global norm"
            );
            assert_eq!(
                global(&plain),
                global(&per_tensor),
                "layout {seed} {norm:?}: per_tensor(true) moved the global norm"
            );
            assert_eq!(
                plain_grads, logged_grads,
                "{norm:?}: tensor_norms(true) changed the clipped gradients"
            );
            assert_eq!(logged.tensor_norms.len(), sizes.len());
            assert_eq!(
                bits(&logged.tensor_norms),
                bits(&per_tensor.tensor_norms),
                "{norm:?}: per-tensor norms differ between tensor_norms and per_tensor"
            );
        }
    }
}

/// A tensor alone in its layout gets the global results as its own: its
/// per-tensor norm and factor have the global norm's and factor's bits, and
/// a per-tensor clip leaves the same gradient bits as the global clip, as
/// in PyTorch, where the total of one tensor is that tensor's norm.
///
/// The tensor's partials (one per flat chunk) must be folded in the order
/// finalize folds the chunks. The first layouts show any other order on
/// every adapter: a 4096 in the first chunk and a 1 in each of the others,
/// so each chunk's sum of squares is exact and one order of additions
/// differs from another only in what rounds away against 2^24 (front to
/// back, every 1 does). They take a tensor of 20 to 2 WG + 1 partials, on
/// either side of the bounds where the folds change: groups of 16 shares,
/// and one workgroup a tensor past WG partials (long_tensor_stats). The
/// last layouts are gradients as they come, where an order front to back
/// moved an L2 factor by an ulp on lavapipe.
#[test]
fn a_lone_tensor_gets_the_global_results() {
    let g = gpu();
    let probe_layout = GradLayout::from_sizes(&[1]).unwrap();
    let probe = common::buffers::upload_bytes(&g.device, &[0; 4]);
    let chunk = g
        .clipper
        .bind(&probe, &probe_layout)
        .unwrap()
        .chunk_elements() as usize;
    let lone = |data: &[f32], what: &str, norms: &[Norm]| {
        let layout = GradLayout::from_sizes(&[data.len()]).unwrap();
        let bytes: &[u8] = bytemuck::cast_slice(data);
        for &norm in norms {
            let base = ClipNorm::new(1e-3).norm(norm);
            let what = format!("{what}, {norm:?}");
            let (global_clip, global_words) =
                clip_once(&g.clipper, &layout, GradType::F32, bytes, &base);
            let (per_tensor, per_tensor_words) = clip_once(
                &g.clipper,
                &layout,
                GradType::F32,
                bytes,
                &base.per_tensor(true),
            );
            assert!(global_clip.coefficient < 1.0, "{what}: the clip must scale");
            assert_eq!(
                global(&global_clip),
                global(&per_tensor),
                "{what}: per_tensor(true) moved the global results"
            );
            assert_eq!(
                (
                    per_tensor.tensor_norms[0].to_bits(),
                    per_tensor.tensor_coefficients[0].to_bits()
                ),
                (
                    global_clip.total_norm.to_bits(),
                    global_clip.coefficient.to_bits()
                ),
                "{what}: the tensor's norm and factor against the global ones ({:e}, {:e})",
                per_tensor.tensor_norms[0],
                global_clip.total_norm
            );
            assert!(
                global_words == per_tensor_words,
                "{what}: a per-tensor clip left other gradients"
            );
        }
    };
    let wg = g.clipper.workgroup_size() as usize;
    // WG >= 32 (fold.wgsl's tree_reduce), so the counts are distinct.
    for parts in [20, 25, wg - 1, wg, wg + 1, 2 * wg + 1] {
        let spikes = layouts::spiked_chunks(parts, chunk);
        let layout = GradLayout::from_sizes(&[spikes.len()]).unwrap();
        let spiked = clip_once(
            &g.clipper,
            &layout,
            GradType::F32,
            bytemuck::cast_slice(&spikes),
            &ClipNorm::new(1.0),
        );
        assert!(
            spiked.0.total_norm > 4096.0,
            "{parts} partials: the 1s must not all round away in the global fold"
        );
        lone(
            &spikes,
            &format!("a 4096 and a 1 a chunk, {parts} partials"),
            &[NORMS.as_slice(), &[Norm::P(1.5)]].concat(),
        );
    }
    lone(&values(1_000_003, 3), "1 000 003 values", &NORMS);
    lone(
        &values(5_000_001, 5),
        "5 000 001 values",
        &[Norm::L2, Norm::P(1.5)],
    );
    assert_no_wgpu_errors();
}

/// f16 bits of `data` (round to nearest even by the `half` crate), packed
/// as `bind_as` expects, padding elements holding a NaN that no pass may read.
fn f16_bytes(layout: &GradLayout, data: &[f32]) -> Vec<u8> {
    let mut out = vec![0x7e01u16; layout.packed_elements(GradType::F16) as usize];
    for t in 0..layout.len() {
        let r = layout.range(t);
        let p = layout.packed_range(t, GradType::F16);
        for (k, x) in data[r.start as usize..r.end as usize].iter().enumerate() {
            // Keep every value inside f16's range.
            out[p.start as usize + k] = half::f16::from_f32(x.clamp(-6e4, 6e4)).to_bits();
        }
    }
    bytemuck::cast_slice(&out).to_vec()
}

#[test]
fn native_and_packed_f16_give_the_same_bits() {
    let g = gpu();
    let Some(packed) = common::forced_packed_clipper() else {
        // GL and SwiftShader have no shader-f16: every f16 clip there takes
        // the packed path, so there is nothing that could differ. Lavapipe
        // (in CI) has it and runs the comparison.
        assert_eq!(g.clipper.f16_path(), ElementPath::F16Packed);
        eprintln!(
            "{}: no shader-f16, only the packed f16 path exists",
            g.info.name
        );
        return;
    };
    let native = &g.clipper;
    assert_eq!(native.f16_path(), ElementPath::F16Native);
    for seed in 0..SEEDS {
        let sizes = sizes(seed);
        let layout = GradLayout::from_sizes(&sizes).unwrap();
        for norm in F16_NORMS {
            let data = values(sizes.iter().sum(), seed);
            let bytes = f16_bytes(&layout, &data);
            let base = ClipNorm::new(1e-3).norm(norm);
            for clip in [base, base.tensor_norms(true), base.per_tensor(true)] {
                let (a, a_words) = clip_once(native, &layout, GradType::F16, &bytes, &clip);
                let (b, b_words) = clip_once(packed, &layout, GradType::F16, &bytes, &clip);
                assert!(a.coefficient < 1.0, "{clip:?}: the clip must scale");
                assert_same_clip(
                    (&a, &a_words),
                    (&b, &b_words),
                    &format!("layout {seed} {clip:?}"),
                );
            }
        }
    }
}

/// The reduce takes one workgroup per flat chunk, laid out on a 2D grid
/// where one dimension of a dispatch cannot hold them (plan::grid), and the
/// scale, clamp and per-tensor passes stride with fewer workgroups. A device
/// whose dispatches hold 7 workgroups per dimension takes a 7 x 6 grid for
/// the 40 chunks below (two spare workgroups) and 7-workgroup strides
/// everywhere else; no bit may differ from the full-sized device's, and a
/// limit of 5 (8 rows of 5 would be needed) is refused at bind.
#[test]
fn a_narrow_dispatch_limit_changes_no_bit() {
    let g = gpu();
    let (device, queue, narrow) = common::device_with_limits("7-workgroup device", |l| {
        l.max_compute_workgroups_per_dimension = 7;
    });
    assert_eq!(device.limits().max_compute_workgroups_per_dimension, 7);
    let mut sizes = FIXED.to_vec();
    sizes.push(1_160_000);
    let n: usize = sizes.iter().sum();
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let data = values(n, 11);
    let bytes: &[u8] = bytemuck::cast_slice(&data);

    let probe = common::buffers::upload_bytes(&device, bytes);
    let set = narrow.bind(&probe, &layout).unwrap();
    assert_eq!(
        n.div_ceil(set.chunk_elements() as usize),
        40,
        "the layout must make 40 flat chunks"
    );
    // One norm per reduction kind (the KIND override): the grid and the
    // strides are the same code for every power, and each power is a set of
    // pipelines the narrow device compiles again (SwiftShader has no disk
    // cache: this test took 89 s there with L1 and p = 3 too).
    for norm in [Norm::L2, Norm::Inf, Norm::P(1.5)] {
        let base = ClipNorm::new(1e-3).norm(norm);
        for clip in [base, base.tensor_norms(true), base.per_tensor(true)] {
            let (want, want_words) = clip_once(&g.clipper, &layout, GradType::F32, bytes, &clip);
            let (got, got_words) = clip_on(
                &device,
                &queue,
                &narrow,
                &layout,
                GradType::F32,
                bytes,
                &clip,
            );
            assert!(want.coefficient < 1.0, "{clip:?}: the clip must scale");
            assert_same_clip(
                (&got, &got_words),
                (&want, &want_words),
                &format!("{clip:?}"),
            );
        }
    }
    let clamped = |device: &wgpu::Device, queue: &wgpu::Queue, clipper: &Clipper| {
        let buf = common::buffers::upload_bytes(device, bytes);
        let set = clipper.bind(&buf, &layout).unwrap();
        let mut encoder = device.create_command_encoder(&Default::default());
        set.clip_value(&mut encoder, -0.25, 0.5).unwrap();
        queue.submit([encoder.finish()]);
        bits(&common::download_all(device, queue, &buf))
    };
    let want: Vec<f32> = data.iter().map(|x| x.clamp(-0.25, 0.5)).collect();
    assert!(
        clamped(&device, &queue, &narrow) == bits(&want),
        "clamp on the narrow device"
    );
    assert!(
        clamped(&g.device, &g.queue, &g.clipper) == bits(&want),
        "clamp"
    );
    assert_no_wgpu_errors();

    let (device, _, five) = common::device_with_limits("5-workgroup device", |l| {
        l.max_compute_workgroups_per_dimension = 5;
    });
    let buf = common::buffers::upload_bytes(&device, bytes);
    match five.bind(&buf, &layout) {
        Err(gradclip::Error::TooLarge {
            needed: 8,
            limit: 5,
            ..
        }) => {}
        other => panic!("40 chunks in 5 x 5 workgroups: {:?}", other.err()),
    }
    assert_no_wgpu_errors();
}
