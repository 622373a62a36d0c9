//! The passes walk 16-byte quads of the window (vec4 loads for f32): runs
//! that start or end inside a quad share it with their neighbours. These
//! tests put tensors at every offset inside a quad and check that
//!  - each edge element is counted once and written only by its own run
//!    (per-tensor factors differ, so a write from a neighbour shows);
//!  - f32 windows that end on no 16-byte boundary (four scalar loads per
//!    quad) give the same bits as vec4 windows;
//!  - everything matches the float64 reference.

use crate::common;

use common::adaptive_reference::Rng;
use common::buffers::PAD_WORD;
use common::reference::{self, Order};
use common::{assert_no_wgpu_errors, download, gpu, layouts, rel_diff};
use gradclip::{ClipNorm, ElementPath, GradLayout, Norm};

/// Tensor sizes that start and end at every offset inside a quad: tiny
/// tensors inside one quad, tensors that fill one exactly, and long ones
/// whose inner quads span several teams and chunks (over 32768 elements).
const SIZES: [usize; 16] = [1, 2, 3, 5, 4, 7, 1, 33001, 2, 6, 70003, 3, 9, 1, 4, 257];

fn sizes_total() -> usize {
    SIZES.iter().sum()
}

/// Gradients of a few decades per tensor, so that per-tensor norms and
/// factors all differ; `wild` adds elements outside the fast path's band
/// (huge, tiny, subnormal) at edges and inside.
fn gradients(seed: u64, wild: bool) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(sizes_total());
    for (t, &n) in SIZES.iter().enumerate() {
        let scale = 10f64.powi((t % 5) as i32 - 2);
        for i in 0..n {
            let mut g = (rng.normal() * scale) as f32;
            if wild && (i == 0 || i + 1 == n || rng.uniform() < 0.001) {
                g = match rng.next_u64() % 3 {
                    0 => g * 1e30,
                    1 => g * 1e-30,
                    _ => g * 1e-40,
                };
            }
            out.push(g);
        }
    }
    out
}

/// A buffer holding `data` and then `pad` NaN elements nobody may touch.
fn buffer_with_padding(data: &[f32], pad: usize) -> wgpu::Buffer {
    let mut all = data.to_vec();
    all.extend(std::iter::repeat_n(f32::from_bits(PAD_WORD), pad));
    common::buffers::upload_exact(&gpu().device, bytemuck::cast_slice(&all))
}

struct Outcome {
    /// None for a value clip, which reports nothing.
    report: Option<gradclip::ClipReport>,
    after: Vec<f32>,
}

/// One clip of `data` bound in a buffer with `pad` elements after it: by
/// norm, or with `None` by value into [-0.05, 0.03].
fn clip(data: &[f32], pad: usize, want_path: ElementPath, clip: Option<&ClipNorm>) -> Outcome {
    clip_sizes(&SIZES, data, pad, want_path, clip)
}

/// [`clip`] of a layout of `sizes`.
fn clip_sizes(
    sizes: &[usize],
    data: &[f32],
    pad: usize,
    want_path: ElementPath,
    clip: Option<&ClipNorm>,
) -> Outcome {
    let g = gpu();
    let buffer = buffer_with_padding(data, pad);
    let layout = GradLayout::from_sizes(sizes).unwrap();
    let set = g.clipper.bind(&buffer, &layout).unwrap();
    assert_eq!(set.element_paths(), [want_path], "pad {pad}");
    let mut encoder = g.device.create_command_encoder(&Default::default());
    match clip {
        Some(c) => set.clip_norm(&mut encoder, c).unwrap(),
        None => set.clip_value(&mut encoder, -0.05, 0.03).unwrap(),
    }
    g.queue.submit([encoder.finish()]);
    let report = clip.map(|_| pollster::block_on(set.read_report()).unwrap());
    let all = download(&g.device, &g.queue, &buffer, data.len() + pad);
    for (i, p) in all[data.len()..].iter().enumerate() {
        assert_eq!(p.to_bits(), PAD_WORD, "padding element {i} written");
    }
    assert_no_wgpu_errors();
    Outcome {
        report,
        after: all[..data.len()].to_vec(),
    }
}

fn tensor(data: &[f32], t: usize) -> &[f32] {
    let start: usize = SIZES[..t].iter().sum();
    &data[start..start + SIZES[t]]
}

fn assert_same_bits(a: &Outcome, b: &Outcome, what: &str) {
    let (Some(ra), Some(rb)) = (&a.report, &b.report) else {
        panic!("{what}: a norm clip reports");
    };
    assert_eq!(
        ra.total_norm.to_bits(),
        rb.total_norm.to_bits(),
        "{what}: total norm"
    );
    assert_eq!(
        ra.coefficient.to_bits(),
        rb.coefficient.to_bits(),
        "{what}: coefficient"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&ra.tensor_norms),
        bits(&rb.tensor_norms),
        "{what}: tensor norms"
    );
    reference::assert_identical(&a.after, &b.after, what);
}

/// Padding elements after a layout's n elements that make the window end
/// inside a quad (none: it ends where the buffer does) and on one (the
/// window rounds up to the quad's end), so that the tests take both f32
/// paths.
fn unaligned_pad(n: usize) -> (usize, usize) {
    assert_ne!(n % 4, 0, "the layout must end inside a quad");
    (0, 4 - n % 4)
}

#[test]
fn tensors_at_every_offset_in_a_quad_follow_float64_on_both_f32_paths() {
    let (unaligned, aligned) = unaligned_pad(sizes_total());
    for wild in [false, true] {
        let data = gradients(if wild { 7 } else { 3 }, wild);
        let cases: Vec<(String, ClipNorm, Order)> = vec![
            (
                "L2".into(),
                ClipNorm::new(1.0).tensor_norms(true),
                Order::L2,
            ),
            (
                "Inf".into(),
                ClipNorm::new(0.5).norm(Norm::Inf).tensor_norms(true),
                Order::Inf,
            ),
            (
                "p=3".into(),
                ClipNorm::new(1.0).norm(Norm::P(3.0)).tensor_norms(true),
                Order::P(3.0),
            ),
        ];
        for (name, c, order) in cases {
            let what = format!("{name} wild={wild}");
            let a = clip(&data, unaligned, ElementPath::F32Unaligned, Some(&c));
            let b = clip(&data, aligned, ElementPath::F32, Some(&c));
            assert_same_bits(&a, &b, &what);
            let report = b.report.as_ref().unwrap();
            let norm = reference::norm(&data, order);
            assert!(
                rel_diff(report.total_norm as f64, norm) <= 1e-5,
                "{what}: norm {} vs {norm}",
                report.total_norm
            );
            reference::assert_tensor_norms(&report.tensor_norms, &data, &SIZES, order, 1e-5, &what);
            let max_norm = c.max_norm() as f64;
            reference::assert_close(
                &b.after,
                &reference::torch_clipped(&data, norm, max_norm),
                1e-6,
                &what,
            );
        }
    }
}

#[test]
fn per_tensor_factors_reach_exactly_their_own_elements() {
    let (unaligned, aligned) = unaligned_pad(sizes_total());
    let data = gradients(11, false);
    let c = ClipNorm::new(0.25).per_tensor(true);
    let a = clip(&data, unaligned, ElementPath::F32Unaligned, Some(&c));
    let b = clip(&data, aligned, ElementPath::F32, Some(&c));
    assert_same_bits(&a, &b, "per tensor");
    let mut clipped = 0;
    for t in 0..SIZES.len() {
        let x = tensor(&data, t);
        let norm = reference::norm(x, Order::L2);
        let want = reference::torch_clipped(x, norm, 0.25);
        let got = tensor(&b.after, t);
        // Each tensor's elements carry its own factor: a neighbour's write
        // into a shared quad would put the other tensor's factor there.
        reference::assert_close(got, &want, 1e-6, &format!("tensor {t}"));
        if norm > 0.25 {
            clipped += 1;
        }
    }
    assert!(
        clipped >= 8,
        "only {clipped} tensors clipped: factors must differ"
    );
}

#[test]
fn clamped_values_reach_exactly_their_own_elements() {
    let (unaligned, aligned) = unaligned_pad(sizes_total());
    let data = gradients(5, true);
    let a = clip(&data, unaligned, ElementPath::F32Unaligned, None);
    let b = clip(&data, aligned, ElementPath::F32, None);
    reference::assert_identical(&a.after, &b.after, "clamp");
    let want: Vec<f32> = data.iter().map(|g| g.clamp(-0.05, 0.03)).collect();
    reference::assert_identical(&b.after, &want, "clamp vs reference");
}

/// Runs of one-element tensors that start at every offset in a quad, to
/// which the reduce pass gives their norms and factors from its flat
/// walk's loads (reduce.wgsl, reduce_flat_units, unit_stats): the same bits
/// on both f32 paths (the other tests bind most of their layouts on the
/// aligned one), each factor on its own element only, and float64's norms.
#[test]
fn unit_runs_give_the_same_bits_on_both_f32_paths() {
    let sizes = layouts::unit_runs(&[(1, 40), (2, 9), (3, 300), (4, 2)], 1001);
    let n: usize = sizes.iter().sum();
    let (unaligned, aligned) = unaligned_pad(n);
    let mut rng = Rng::new(23);
    let data: Vec<f32> = (0..n)
        .map(|i| (rng.normal() * 10f64.powi((i % 7) as i32 - 3)) as f32)
        .collect();
    for (name, c, order) in [
        ("L2", ClipNorm::new(0.05).per_tensor(true), Order::L2),
        (
            "p=3",
            ClipNorm::new(0.05).norm(Norm::P(3.0)).per_tensor(true),
            Order::P(3.0),
        ),
    ] {
        let a = clip_sizes(
            &sizes,
            &data,
            unaligned,
            ElementPath::F32Unaligned,
            Some(&c),
        );
        let b = clip_sizes(&sizes, &data, aligned, ElementPath::F32, Some(&c));
        assert_same_bits(&a, &b, name);
        let report = b.report.as_ref().unwrap();
        reference::assert_tensor_norms(&report.tensor_norms, &data, &sizes, order, 1e-5, name);
        let (norms, want) = reference::per_tensor_reference(&data, &sizes, order, 0.05, false);
        let clipped = norms.iter().filter(|&&norm| norm > 0.05).count();
        assert!(clipped > 100, "{name}: only {clipped} tensors clipped");
        reference::assert_close(&b.after, &want, 1e-6, name);
    }
}
