//! Long flat chunks: on CPU adapters a set with the elements for 64 chunks
//! of 131072 takes that length (`GradSet::chunk_elements`), and the reduce
//! sizes its lists of a chunk's segments for it (tiny, medium and long
//! segments have other bounds there). Global and per-tensor results over
//! such chunks follow float64 for every segment class, and per-tensor
//! factors reach exactly their own elements.

use crate::common;

use common::adaptive_reference::Rng;
use common::reference::{self, Order};
use common::{gpu, rel_diff, run_clip};
use gradclip::{ClipNorm, Norm};

/// Segment lengths around every bound of the reduce (32 and 128 elements:
/// element-wise folds; 256 on GPUs and 8192 on CPU adapters: one
/// invocation's; longer: the workgroup's;
/// longer than a chunk), then whole chunks of 128-element tensors (as many
/// one-invocation segments as a chunk can hold, 1024) and of 40-element
/// ones (one-invocation folds on GPUs, element-wise on CPU adapters),
/// repeated until the set has the elements for 64 chunks of 131072.
fn sizes() -> Vec<usize> {
    const PATTERN: [usize; 22] = [
        1, 5, 31, 64, 100, 127, 128, 255, 256, 257, 500, 2048, 5000, 8191, 8192, 8193, 40_000,
        131_071, 131_072, 200_003, 3, 70_000,
    ];
    let mut sizes = Vec::new();
    while sizes.iter().sum::<usize>() < 64 * 131_072 {
        sizes.extend(PATTERN);
        sizes.extend([128; 1100]);
        sizes.extend([40; 3500]);
    }
    sizes
}

#[test]
fn long_chunks_follow_float64_for_every_segment_class() {
    let sizes = sizes();
    let mut rng = Rng::new(21);
    let mut data = Vec::with_capacity(sizes.iter().sum());
    for (t, &n) in sizes.iter().enumerate() {
        // Each tensor its own decade, so that the norms and factors differ.
        let scale = 10f64.powi((t % 7) as i32 - 3);
        data.extend((0..n).map(|_| (rng.normal() * scale) as f32));
    }
    let starts: Vec<usize> = sizes
        .iter()
        .scan(0, |at, &n| {
            *at += n;
            Some(*at - n)
        })
        .collect();
    let tensor = |v: &[f32], t: usize| v[starts[t]..starts[t] + sizes[t]].to_vec();
    let chunk = match gpu().info.device_type {
        wgpu::DeviceType::Cpu => 131_072,
        _ => 32_768,
    };
    for (name, clip, order) in [
        ("L2", ClipNorm::new(1.0), Order::L2),
        ("Inf", ClipNorm::new(0.5).norm(Norm::Inf), Order::Inf),
        ("p=3", ClipNorm::new(1.0).norm(Norm::P(3.0)), Order::P(3.0)),
    ] {
        let (report, after) = run_clip(&data, &sizes, |set, enc| {
            assert_eq!(set.chunk_elements(), chunk, "{name}");
            set.clip_norm(enc, &clip.per_tensor(true))
        });
        let report = report.unwrap();
        let total = reference::norm(&data, order);
        assert!(
            rel_diff(report.total_norm as f64, total) <= 1e-5,
            "{name}: norm {} vs {total}",
            report.total_norm
        );
        let wants =
            reference::assert_tensor_norms(&report.tensor_norms, &data, &sizes, order, 1e-5, name);
        for (t, want) in wants.into_iter().enumerate() {
            let clipped = reference::torch_clipped(&tensor(&data, t), want, clip.max_norm() as f64);
            reference::assert_close(
                &tensor(&after, t),
                &clipped,
                1e-6,
                &format!("{name}: tensor {t}"),
            );
        }
    }
}
