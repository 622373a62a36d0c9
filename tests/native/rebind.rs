//! `rebind_ranges`: moving a set to gradients at new places keeps its
//! scratch, stats and reports; going back to the previous places makes no
//! new GPU object; every clip scales the gradients it was recorded with.

use crate::common;

use common::reference::{self, assert_close, Order};
use common::{assert_no_wgpu_errors, download_all, gpu, upload};
use gradclip::{ClipNorm, GradLayout, GradType};

fn places<'a>(
    pool: &'a wgpu::Buffer,
    offsets: &[u64],
    sizes: &[usize],
) -> Vec<(wgpu::BufferBinding<'a>, GradType)> {
    offsets
        .iter()
        .zip(sizes)
        .map(|(&offset, &size)| {
            (
                wgpu::BufferBinding {
                    buffer: pool,
                    offset: offset * 4,
                    size: wgpu::BufferSize::new(size as u64 * 4),
                },
                GradType::F32,
            )
        })
        .collect()
}

fn ramp(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * seed)
        .collect()
}

#[test]
fn rebinding_back_and_forth_clips_the_right_gradients() {
    let g = gpu();
    let sizes = [3000usize, 1, 70_000, 17];
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let n: usize = sizes.iter().sum();
    // Two pools; in the second the tensors sit in another order with gaps,
    // so its plan (and chunk count) differs from the first's.
    let pool_a = upload(&g.device, &vec![0.0; n]);
    let pool_b = upload(&g.device, &vec![0.0; n + 4096]);
    let mut offsets_a = vec![0u64];
    for s in &sizes[..3] {
        offsets_a.push(offsets_a.last().unwrap() + *s as u64);
    }
    let offsets_b = [71_024u64, 70_000 + 1024 + 3000 + 64, 0, 70_000 + 16];
    let a = places(&pool_a, &offsets_a, &sizes);
    let b = places(&pool_b, &offsets_b, &sizes);
    let mut set = g.clipper.bind_ranges_as(&layout, &a).unwrap();

    for (step, (pool, offsets, at_places)) in [
        (&pool_a, &offsets_a[..], &a),
        (&pool_b, &offsets_b[..], &b),
        (&pool_a, &offsets_a[..], &a),
        (&pool_b, &offsets_b[..], &b),
        (&pool_b, &offsets_b[..], &b),
    ]
    .into_iter()
    .enumerate()
    {
        // Fresh gradients at this step's places.
        let data = ramp(n, 0.01 * (step + 1) as f32);
        write_at(g, pool, offsets, &sizes, &data);
        set.rebind_ranges(at_places).unwrap();
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
        g.queue.submit([encoder.finish()]);
        let norm = reference::norm(&data, Order::L2);
        let want = reference::torch_clipped(&data, norm, 1.0);
        let got = read_at(g, pool, offsets, &sizes);
        assert_close(&got, &want, 1e-6, &format!("step {step}"));
        let report = pollster::block_on(set.read_report()).unwrap();
        assert_eq!(report.step, step as u64 + 1);
        assert!((report.total_norm as f64 - norm).abs() <= 1e-6 * norm);
    }
    // a -> b (built), b -> a (kept), a -> b (kept), b -> b (nothing).
    assert_eq!((set.rebind_count(), set.rebuild_count()), (3, 1));
    assert_no_wgpu_errors();
}

/// `count` tensors of `sizes` scattered over `pool` from `start` (elements):
/// each after a gap of its own, in an order turned by `turn`.
fn scattered(sizes: &[usize], start: u64, turn: usize) -> Vec<u64> {
    let mut offsets = vec![0u64; sizes.len()];
    let mut at = start;
    for k in 0..sizes.len() {
        let t = (k + turn) % sizes.len();
        offsets[t] = at;
        at += sizes[t] as u64 + 1 + ((k * 7 + turn) % 13) as u64;
    }
    offsets
}

fn write_at(g: &common::Gpu, pool: &wgpu::Buffer, offsets: &[u64], sizes: &[usize], data: &[f32]) {
    let mut at = 0;
    for (&offset, &size) in offsets.iter().zip(sizes) {
        g.queue
            .write_buffer(pool, offset * 4, bytemuck::cast_slice(&data[at..at + size]));
        at += size;
    }
}

fn read_at(g: &common::Gpu, pool: &wgpu::Buffer, offsets: &[u64], sizes: &[usize]) -> Vec<f32> {
    let whole = download_all(&g.device, &g.queue, pool);
    let mut got = Vec::new();
    for (&offset, &size) in offsets.iter().zip(sizes) {
        got.extend_from_slice(&whole[offset as usize..offset as usize + size]);
    }
    got
}

/// A memory pool that hands the gradients back somewhere else in the same
/// buffer every step (burn's does): the set is moved by new table bytes,
/// never by new bind groups, and every step clips the gradients where they
/// are now, checked against float64.
#[test]
fn gradients_moving_inside_a_pool_build_nothing() {
    let g = gpu();
    let sizes: Vec<usize> = (0..40)
        .map(|t| [1, 300, 9000, 17, 2048][t % 5] + t)
        .collect();
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let n: usize = sizes.iter().sum();
    let pool = upload(&g.device, &vec![0.0; 4 * n]);
    let first = scattered(&sizes, 0, 0);
    let mut set = g
        .clipper
        .bind_ranges_as(&layout, &places(&pool, &first, &sizes))
        .unwrap();
    for step in 0..12usize {
        let offsets = scattered(&sizes, (step * 1031 % 5000) as u64, step % 5 + 1);
        let data = ramp(n, 0.003 * (step + 1) as f32);
        write_at(g, &pool, &offsets, &sizes, &data);
        assert!(set.rebind_ranges(&places(&pool, &offsets, &sizes)).unwrap());
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(
            &mut encoder,
            &ClipNorm::new(1.0).tensor_norms(step % 2 == 0),
        )
        .unwrap();
        g.queue.submit([encoder.finish()]);
        let norm = reference::norm(&data, Order::L2);
        let want = reference::torch_clipped(&data, norm, 1.0);
        let got = read_at(g, &pool, &offsets, &sizes);
        assert_close(&got, &want, 1e-6, &format!("step {step}"));
        let report = pollster::block_on(set.read_report()).unwrap();
        assert_eq!(report.step, step as u64 + 1);
        assert!((report.total_norm as f64 - norm).abs() <= 1e-6 * norm);
        if step % 2 == 0 {
            // Per-tensor norms follow each tensor to its new place.
            let mut at = 0;
            for (t, &size) in sizes.iter().enumerate() {
                let want = reference::norm(&data[at..at + size], Order::L2);
                let got = report.tensor_norms[t] as f64;
                assert!((got - want).abs() <= 1e-6 * want, "step {step} tensor {t}");
                at += size;
            }
        }
    }
    // The first move builds bindings that can move; the other eleven move them.
    assert_eq!((set.rebind_count(), set.rebuild_count()), (12, 1));
    assert_no_wgpu_errors();
}

/// Clips recorded at two places of one pool, their encoders submitted in
/// the other order: each clips the gradients it was recorded with.
#[test]
fn moved_clips_submitted_out_of_order_clip_their_own_places() {
    clip_two_places_out_of_order([1.0, 3.0], None);
}

/// The same with an adaptive clip, whose step records the norm, its pass
/// and the clip in two halves: ZClip in its warm-up clips to its cap.
#[test]
fn moved_adaptive_clips_submitted_out_of_order_clip_their_own_places() {
    let zclip = gradclip::ZClip::new().warmup_steps(100).max_norm(Some(1.0));
    clip_two_places_out_of_order([1.0, 1.0], Some(zclip.into()));
}

/// Records a clip to `max_norms[k]` at each of two places of one pool
/// (fixed, or `adaptive` with its threshold equal to it), submits the two
/// encoders in the other order, and checks each place against float64.
fn clip_two_places_out_of_order(max_norms: [f32; 2], adaptive: Option<gradclip::AdaptiveMethod>) {
    let g = gpu();
    let sizes = [5000usize, 3, 12_000, 64];
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let n: usize = sizes.iter().sum();
    let pool = upload(&g.device, &vec![0.0; 3 * n + 256]);
    let mut set = g
        .clipper
        .bind_ranges_as(&layout, &places(&pool, &scattered(&sizes, 0, 0), &sizes))
        .unwrap();
    let adaptive = adaptive.map(|m| gradclip::AdaptiveClip::new(&set, m).unwrap());
    let p1 = scattered(&sizes, n as u64, 1);
    let p2 = scattered(&sizes, 2 * n as u64 + 100, 2);
    // Disjoint: p2 starts after p1's last tensor.
    assert!(
        p2.iter().min()
            > p1.iter()
                .zip(&sizes)
                .map(|(o, s)| o + *s as u64)
                .max()
                .as_ref()
    );
    let d1 = ramp(n, 0.02);
    let d2 = ramp(n, 0.7);
    write_at(g, &pool, &p1, &sizes, &d1);
    write_at(g, &pool, &p2, &sizes, &d2);
    let mut encoders = Vec::new();
    for (offsets, max_norm) in [(&p1, max_norms[0]), (&p2, max_norms[1])] {
        set.rebind_ranges(&places(&pool, offsets, &sizes)).unwrap();
        let mut encoder = g.device.create_command_encoder(&Default::default());
        let clip = ClipNorm::new(max_norm);
        match &adaptive {
            Some(a) => a.clip(&set, &mut encoder, &clip).unwrap(),
            None => set.clip_norm(&mut encoder, &clip).unwrap(),
        }
        encoders.push(encoder.finish());
    }
    assert_eq!(
        set.rebuild_count(),
        1,
        "the second place moves the first's bindings"
    );
    encoders.reverse();
    g.queue.submit(encoders);
    for (offsets, data, max_norm, what) in [
        (&p1, &d1, max_norms[0], "first"),
        (&p2, &d2, max_norms[1], "second"),
    ] {
        let norm = reference::norm(data, Order::L2);
        let want = reference::torch_clipped(data, norm, max_norm as f64);
        assert_close(&read_at(g, &pool, offsets, &sizes), &want, 1e-6, what);
    }
    assert_no_wgpu_errors();
}
