//! `GradSet::clip_norm_timed`: the same clip as `clip_norm`, plus timestamps
//! in the caller's query set. Checks results and ordering, never speed.

use wgpu::util::DeviceExt;

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

fn device(features: wgpu::Features) -> Option<(wgpu::Device, wgpu::Queue)> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .expect("no wgpu adapter for the GPU tests");
    if !adapter.features().contains(features) {
        return None;
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("timed test device"),
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .expect("request_device");
    Some((device, queue))
}

fn read(device: &wgpu::Device, queue: &wgpu::Queue, src: &wgpu::Buffer) -> Vec<u8> {
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("timed test readback"),
        size: src.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, &staging, 0, src.size());
    queue.submit([enc.finish()]);
    staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let bytes = staging.get_mapped_range(..).expect("mapped range").to_vec();
    staging.unmap();
    bytes
}

fn grads(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i % 13) as f32 - 6.0) * 0.25).collect()
}

#[test]
fn timed_clip_matches_untimed_and_stamps_are_ordered() {
    let features = wgpu::Features::TIMESTAMP_QUERY;
    let Some((device, queue)) = device(features) else {
        eprintln!("adapter has no TIMESTAMP_QUERY: covered by the next test only");
        return;
    };
    let inside_passes = device
        .features()
        .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
    let clipper = gradclip::Clipper::new(&device, &queue).unwrap();
    let sizes = [30_000, 7, 0, 20_000];
    let layout = gradclip::GradLayout::from_sizes(&sizes).unwrap();
    let host = grads(layout.total_elements() as usize);
    let make = || {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("timed test gradients"),
            contents: bytemuck::cast_slice(&host),
            usage: USAGE,
        })
    };
    let (plain_buf, timed_buf) = (make(), make());
    let plain = clipper.bind(&plain_buf, &layout).unwrap();
    let timed = clipper.bind(&timed_buf, &layout).unwrap();
    let queries = device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("timed test queries"),
        ty: wgpu::QueryType::Timestamp,
        count: 8,
    });
    let n = gradclip::GradSet::CLIP_TIMESTAMPS;
    let clip = gradclip::ClipNorm::new(1.0);

    // Out of range: an error, nothing recorded.
    let mut enc = device.create_command_encoder(&Default::default());
    let err = timed.clip_norm_timed(&mut enc, &clip, &queries, 8 - n + 1);
    assert!(
        matches!(err, Err(gradclip::Error::TooLarge { .. })),
        "{err:?}"
    );

    let mut enc = device.create_command_encoder(&Default::default());
    plain.clip_norm(&mut enc, &clip).unwrap();
    timed.clip_norm_timed(&mut enc, &clip, &queries, 2).unwrap();
    let resolve = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("timed test resolve"),
        size: 8 * 8,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    enc.resolve_query_set(&queries, 2..2 + n, &resolve, 0);
    queue.submit([enc.finish()]);

    let (a, b) = (
        pollster::block_on(plain.read_report()).unwrap(),
        pollster::block_on(timed.read_report()).unwrap(),
    );
    assert!(a.coefficient < 1.0);
    assert_eq!(a.total_norm.to_bits(), b.total_norm.to_bits());
    assert_eq!(a.coefficient.to_bits(), b.coefficient.to_bits());
    assert_eq!(
        read(&device, &queue, &plain_buf),
        read(&device, &queue, &timed_buf),
        "the timed clip must scale exactly like the untimed one"
    );

    let stamps: Vec<u64> = read(&device, &queue, &resolve)[..n as usize * 8]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let order: Vec<usize> = if inside_passes {
        vec![0, 1, 2, 3, 4]
    } else {
        vec![0, 2, 3, 4]
    };
    for w in order.windows(2) {
        assert!(
            stamps[w[0]] <= stamps[w[1]],
            "timestamps out of order: {stamps:?}"
        );
    }
    assert!(stamps[4] > stamps[0], "no time passed: {stamps:?}");
}

#[test]
fn timed_clip_needs_timestamp_queries() {
    let (device, queue) = device(wgpu::Features::empty()).unwrap();
    let clipper = gradclip::Clipper::new(&device, &queue).unwrap();
    let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("timed test gradients"),
        contents: bytemuck::cast_slice(&grads(100)),
        usage: USAGE,
    });
    let layout = gradclip::GradLayout::from_sizes(&[100]).unwrap();
    let set = clipper.bind(&buffer, &layout).unwrap();
    // Occlusion sets need no feature; the check for timestamps comes first.
    let queries = device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("timed test occlusion queries"),
        ty: wgpu::QueryType::Occlusion,
        count: 8,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    let err = set.clip_norm_timed(&mut enc, &gradclip::ClipNorm::new(1.0), &queries, 0);
    assert!(
        matches!(err, Err(gradclip::Error::UnsupportedDevice { .. })),
        "{err:?}"
    );
}

#[test]
fn timed_clip_refuses_a_query_set_that_is_not_for_timestamps() {
    let features = wgpu::Features::TIMESTAMP_QUERY;
    let Some((device, queue)) = device(features) else {
        eprintln!("adapter has no TIMESTAMP_QUERY: the feature check comes first");
        return;
    };
    let clipper = gradclip::Clipper::new(&device, &queue).unwrap();
    let data = grads(100);
    let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("timed test gradients"),
        contents: bytemuck::cast_slice(&data),
        usage: USAGE,
    });
    let layout = gradclip::GradLayout::from_sizes(&[100]).unwrap();
    let set = clipper.bind(&buffer, &layout).unwrap();
    let occlusion = device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("timed test occlusion queries"),
        ty: wgpu::QueryType::Occlusion,
        count: 8,
    });
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut enc = device.create_command_encoder(&Default::default());
    assert_eq!(
        set.clip_norm_timed(&mut enc, &gradclip::ClipNorm::new(1e-3), &occlusion, 0),
        Err(gradclip::Error::NotTimestampQuerySet)
    );
    queue.submit([enc.finish()]);
    assert!(pollster::block_on(scope.pop()).is_none());
    let after: Vec<f32> = bytemuck::cast_slice(&read(&device, &queue, &buffer)).to_vec();
    assert_eq!(after, data, "nothing recorded");
}
