//! Misuse is a typed error before anything is recorded; nothing reaches the
//! user's wgpu error handler and nothing is allocated without bound.

use crate::common;

use common::{assert_no_wgpu_errors, download, gpu, own_gpu, upload, GRAD_USAGE};
use gradclip::{ClipNorm, Error, GradLayout, GradType, Norm};

fn layout(sizes: &[usize]) -> GradLayout {
    GradLayout::from_sizes(sizes).unwrap()
}

#[test]
fn a_mapped_gradient_buffer_is_refused() {
    let g = gpu();
    let buffer = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("still mapped"),
        size: 8,
        usage: GRAD_USAGE,
        mapped_at_creation: true,
    });
    assert!(matches!(
        g.clipper.bind(&buffer, &layout(&[2])),
        Err(Error::BufferMapped { .. })
    ));
    buffer
        .slice(..)
        .get_mapped_range_mut()
        .unwrap()
        .copy_from_slice(bytemuck::cast_slice(&[3.0f32, 4.0]));
    buffer.unmap();
    let set = g.clipper.bind(&buffer, &layout(&[2])).unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::tensorflow(1.0))
        .unwrap();
    g.queue.submit([encoder.finish()]);
    assert_eq!(download(&g.device, &g.queue, &buffer, 2), [0.6, 0.8]);
    assert_no_wgpu_errors();
}

#[test]
fn a_destroyed_gradient_buffer_is_refused_when_recording() {
    let g = gpu();
    let buffer = upload(&g.device, &[3.0, 4.0]);
    let set = g.clipper.bind(&buffer, &layout(&[2])).unwrap();
    buffer.destroy();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    assert!(matches!(
        set.clip_norm(&mut encoder, &ClipNorm::new(1.0)),
        Err(Error::BufferDestroyed { .. })
    ));
    assert!(matches!(
        set.clip_value(&mut encoder, -1.0, 1.0),
        Err(Error::BufferDestroyed { .. })
    ));
    g.queue.submit([encoder.finish()]);
    assert_no_wgpu_errors();
}

#[test]
fn the_sets_own_stats_buffer_is_a_valid_partial_source() {
    let g = gpu();
    let buffer = upload(&g.device, &[3.0, 4.0]);
    let set = g.clipper.bind(&buffer, &layout(&[2])).unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    let clip = ClipNorm::tensorflow(1.0).norm(Norm::P(3.0));
    set.record_norm(&mut encoder, &clip).unwrap();
    set.clip_with_partial_from(
        &mut encoder,
        &clip,
        set.stats_buffer(),
        set.partial_offset(),
    )
    .unwrap();
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();
    let norm = (27.0f64 + 64.0).cbrt();
    assert!((report.total_norm as f64 - norm).abs() <= 1e-6 * norm);
    let after = download(&g.device, &g.queue, &buffer, 2);
    common::reference::assert_close(
        &after,
        &[(3.0 / norm) as f32, (4.0 / norm) as f32],
        1e-6,
        "clipped with its own partial",
    );
    assert_no_wgpu_errors();
}

#[test]
fn buffers_of_another_device_are_refused() {
    // Two devices of one instance. (Objects of another wgpu Instance make
    // wgpu-core panic before any validation; that cannot be caught.)
    let (g, other) = common::two_devices();
    // Four floats: room for a 16-byte partial too.
    let foreign = upload(&other, &[3.0, 4.0, 0.0, 0.0]);
    assert!(matches!(
        g.clipper.bind(&foreign, &layout(&[4])),
        Err(Error::ForeignDevice { .. })
    ));
    let buffer = upload(&g.device, &[3.0, 4.0]);
    let set = g.clipper.bind(&buffer, &layout(&[2])).unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    assert!(matches!(
        set.clip_with_partial_from(&mut encoder, &ClipNorm::new(1.0), &foreign, 0),
        Err(Error::ForeignDevice { .. })
    ));
    g.queue.submit([encoder.finish()]);
    assert_eq!(download(&g.device, &g.queue, &buffer, 2), [3.0, 4.0]);
    assert!(
        g.errors.lock().unwrap().is_empty(),
        "{:?}",
        g.errors.lock().unwrap()
    );
}

#[test]
fn binding_on_a_destroyed_device_is_an_error() {
    let g = own_gpu();
    let buffer = upload(&g.device, &[3.0, 4.0]);
    let set = g.clipper.bind(&buffer, &layout(&[2])).unwrap();
    g.device.destroy();
    assert!(matches!(
        g.clipper.bind(&buffer, &layout(&[2])),
        Err(Error::DeviceLost(_))
    ));
    let mut encoder = g.device.create_command_encoder(&Default::default());
    assert!(set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).is_err());
    assert!(gradclip::Clipper::new(&g.device, &g.queue).is_err());
}

#[test]
fn layout_arithmetic_never_overflows_or_allocates_without_bound() {
    assert_eq!(
        GradLayout::from_sizes(&[usize::MAX]).err(),
        Some(Error::LayoutOverflow)
    );
    assert_eq!(
        GradLayout::from_sizes(&[usize::MAX / 2, usize::MAX / 2, 3]).err(),
        Some(Error::LayoutOverflow)
    );
    let g = gpu();
    let buffer = upload(&g.device, &[0.0; 4]);
    // Far larger than the buffer and than any device: refused before any
    // allocation proportional to the size.
    for dtype in [GradType::F32, GradType::F16, GradType::Bf16] {
        let huge = layout(&[usize::MAX / 4, 7]);
        let started = std::time::Instant::now();
        let result = g.clipper.bind_as(&buffer, &huge, dtype);
        assert!(
            matches!(
                result,
                Err(Error::LayoutExceedsBuffer { .. }
                    | Error::TooLarge { .. }
                    | Error::LayoutOverflow)
            ),
            "{dtype:?}: {result:?}"
        );
        // Not a timing assertion: an allocation of this size would not
        // return at all on this machine; this only names the failure.
        let _ = started;
    }
    // A 16-bit range whose byte size is near 2^64.
    let range = wgpu::BufferBinding {
        buffer: &buffer,
        offset: 0,
        size: wgpu::BufferSize::new(16),
    };
    let huge = layout(&[(u64::MAX / 2 - 1) as usize]);
    let result = g.clipper.bind_ranges_as(&huge, &[(range, GradType::F16)]);
    assert!(
        matches!(
            result,
            Err(Error::RangeMismatch { .. } | Error::LayoutOverflow | Error::TooLarge { .. })
        ),
        "{result:?}"
    );
    assert_no_wgpu_errors();
}
