//! `rebind_ranges`: moving a set to gradients at new places keeps its
//! scratch, stats and reports; going back to the previous places makes no
//! new GPU object; every clip scales the gradients it was recorded with.

mod common;

use common::reference::{self, assert_close, Order};
use common::{assert_no_wgpu_errors, download, gpu, upload};
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
        let mut at = 0;
        for (&offset, &size) in offsets.iter().zip(&sizes) {
            g.queue
                .write_buffer(pool, offset * 4, bytemuck::cast_slice(&data[at..at + size]));
            at += size;
        }
        set.rebind_ranges(at_places).unwrap();
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
        g.queue.submit([encoder.finish()]);
        let norm = reference::norm(&data, Order::L2);
        let want = reference::torch_clipped(&data, norm, 1.0);
        let whole = download(&g.device, &g.queue, pool, (pool.size() / 4) as usize);
        let mut got = Vec::with_capacity(n);
        for (&offset, &size) in offsets.iter().zip(&sizes) {
            got.extend_from_slice(&whole[offset as usize..offset as usize + size]);
        }
        assert_close(&got, &want, 1e-6, &format!("step {step}"));
        let report = pollster::block_on(set.read_report()).unwrap();
        assert_eq!(report.step, step as u64 + 1);
        assert!((report.total_norm as f64 - norm).abs() <= 1e-6 * norm);
    }
    // a -> b (built), b -> a (kept), a -> b (kept), b -> b (nothing).
    assert_eq!((set.rebind_count(), set.rebuild_count()), (3, 1));
    assert_no_wgpu_errors();
}
