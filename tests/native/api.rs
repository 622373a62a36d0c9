//! The public API's contract: misuse is a typed error before any GPU work,
//! reports are asynchronous and optional, a no-clip step dispatches no scale
//! workgroup, and results repeat bit for bit.

use crate::common;

use common::reference::{self, assert_close, assert_identical, Order};
use common::{assert_no_wgpu_errors, download, gpu, run_clip, upload};
use gradclip::{ClipNorm, Error, GradLayout, Norm};

fn ramp(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
        .collect()
}

#[test]
fn invalid_parameters_are_errors_and_touch_nothing() {
    let g = gpu();
    let data = ramp(1000);
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[600, 400]).unwrap())
        .unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    let bad = [
        ClipNorm::new(-1.0),
        ClipNorm::new(f32::NAN),
        ClipNorm::new(f32::INFINITY),
        ClipNorm::tensorflow(0.0),
        ClipNorm::new(1.0).norm(Norm::P(0.0)),
        ClipNorm::new(1.0).norm(Norm::P(-3.0)),
        ClipNorm::new(1.0).norm(Norm::P(f32::NAN)),
    ];
    for clip in bad {
        let err = set
            .clip_norm(&mut encoder, &clip)
            .expect_err("invalid clip accepted");
        assert!(
            matches!(err, Error::InvalidMaxNorm(_) | Error::InvalidNormOrder(_)),
            "{clip:?}: {err}"
        );
    }
    for (lo, hi) in [(1.0, -1.0), (f32::NAN, 1.0), (0.0, f32::NAN)] {
        assert!(matches!(
            set.clip_value(&mut encoder, lo, hi),
            Err(Error::InvalidClampRange { .. })
        ));
    }
    g.queue.submit([encoder.finish()]);
    assert_identical(
        &download(&g.device, &g.queue, &buffer, data.len()),
        &data,
        "after rejected clips",
    );
    assert_eq!(pollster::block_on(set.read_report()), Err(Error::NoReport));
    assert_no_wgpu_errors();
}

#[test]
fn bad_buffers_and_layouts_are_errors() {
    let g = gpu();
    assert_eq!(GradLayout::from_sizes(&[]), Err(Error::EmptyLayout));

    let small = upload(&g.device, &ramp(100));
    let layout = GradLayout::from_sizes(&[60, 41]).unwrap();
    assert_eq!(
        g.clipper.bind(&small, &layout).unwrap_err(),
        Error::LayoutExceedsBuffer {
            needed: 404,
            buffer_size: 400
        }
    );

    let no_storage = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("not storage"),
        size: 400,
        usage: wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    assert!(matches!(
        g.clipper
            .bind(&no_storage, &GradLayout::from_sizes(&[100]).unwrap()),
        Err(Error::MissingUsage { .. })
    ));

    let max = g.device.limits().max_buffer_size;
    let huge = GradLayout::from_sizes(&[(max / 4) as usize, 1]).unwrap();
    assert!(matches!(
        g.clipper.bind(&small, &huge),
        Err(Error::TooLarge { .. })
    ));
    assert_no_wgpu_errors();
}

#[test]
fn layout_of_empty_tensors_has_norm_zero() {
    let (report, after) = run_clip(&[], &[0, 0, 0], |set, enc| {
        set.clip_norm(enc, &ClipNorm::new(1.0))
    });
    let report = report.unwrap();
    assert_eq!(
        (report.total_norm, report.coefficient, report.nonfinite),
        (0.0, 1.0, false)
    );
    assert!(after.is_empty());
}

/// Reads the ClipState that finalize left on the GPU.
fn clip_state(set: &gradclip::GradSet) -> gradclip::records::ClipState {
    let g = gpu();
    let words = download(
        &g.device,
        &g.queue,
        set.stats_buffer(),
        std::mem::size_of::<gradclip::records::ClipState>() / 4,
    );
    bytemuck::pod_read_unaligned(bytemuck::cast_slice(&words))
}

#[test]
fn no_clip_step_dispatches_no_scale_workgroup() {
    let g = gpu();
    let data = ramp(50_000);
    let norm = reference::norm(&data, Order::L2);
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[30_000, 20_000]).unwrap())
        .unwrap();

    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new((norm * 2.0) as f32))
        .unwrap();
    g.queue.submit([encoder.finish()]);
    let state = clip_state(&set);
    assert_eq!(state.coefficient, 1.0);
    assert_eq!(
        state.dispatch,
        [0, 1, 1],
        "no-clip step must skip the scale pass"
    );
    assert_identical(
        &download(&g.device, &g.queue, &buffer, data.len()),
        &data,
        "no-clip step",
    );

    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new((norm / 2.0) as f32))
        .unwrap();
    g.queue.submit([encoder.finish()]);
    let state = clip_state(&set);
    assert!(
        state.coefficient < 0.51 && state.dispatch[0] > 0,
        "{state:?}"
    );
    assert_no_wgpu_errors();
}

/// Per-tensor statistics are spread over many workgroups; finalize learns
/// from them whether any tensor's factor is not 1, for this step only.
#[test]
fn per_tensor_step_dispatches_scale_only_when_a_tensor_clips() {
    let g = gpu();
    // 5000 small tensors (norm 0.3 each) and, last, in the last workgroup
    // of the statistics pass, one large tensor (norm 50).
    let mut sizes = vec![9; 5000];
    sizes.push(2500);
    let mut data: Vec<f32> = (0..5000 * 9)
        .map(|i| if i % 9 == 0 { 0.3 } else { 0.0 })
        .collect();
    data.extend(std::iter::repeat_n(1.0f32, 2500));
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&sizes).unwrap())
        .unwrap();
    let step = |clip: ClipNorm| {
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &clip).unwrap();
        g.queue.submit([encoder.finish()]);
        let report = pollster::block_on(set.read_report()).unwrap();
        (clip_state(&set), report)
    };

    // Only the last tensor clips: its factor alone makes the scale pass run.
    let (state, report) = step(ClipNorm::new(10.0).per_tensor(true));
    assert!(state.dispatch[0] > 0, "{state:?}");
    assert_eq!(report.tensor_norms[5000], 50.0);
    assert!(
        (report.tensor_norms[17] - 0.3).abs() <= 1e-7,
        "{}",
        report.tensor_norms[17]
    );
    let after = download(&g.device, &g.queue, &buffer, data.len());
    assert_identical(&after[..45_000], &data[..45_000], "small tensors");
    let factor = 10.0 / (50.0 + 1e-6);
    assert_close(
        &after[45_000..],
        &vec![factor as f32; 2500],
        1e-6,
        "large tensor",
    );

    // Now nothing clips: the earlier step's clipped tensor must not count.
    let (state, report) = step(ClipNorm::new(100.0).per_tensor(true));
    assert_eq!(state.dispatch, [0, 1, 1], "no tensor clipped");
    assert!(report.tensor_coefficients.iter().all(|&c| c == 1.0));
    assert_identical(
        &download(&g.device, &g.queue, &buffer, data.len()),
        &after,
        "no-clip per-tensor step",
    );

    // Per-tensor norms of a global clip that does not clip: no scale pass either.
    let (state, report) = step(ClipNorm::new(100.0).tensor_norms(true));
    assert_eq!(
        state.dispatch,
        [0, 1, 1],
        "global no-clip with tensor norms"
    );
    assert_eq!(report.tensor_norms.len(), 5001);

    // Every tensor clips.
    let (state, report) = step(ClipNorm::new(0.1).per_tensor(true));
    assert!(state.dispatch[0] > 0, "{state:?}");
    assert!(report.tensor_coefficients.iter().all(|&c| c < 1.0));
    assert_no_wgpu_errors();
}

#[test]
fn reports_follow_the_latest_submitted_step_and_are_optional() {
    let g = gpu();
    let data = ramp(10_000);
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[10_000]).unwrap())
        .unwrap();
    let mut host: Vec<f32> = data.clone();
    // Five steps, each halving the norm, submitted without reading anything.
    let mut want_norm = 0.0;
    for _ in 0..5 {
        let norm = reference::norm(&host, Order::L2);
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new((norm / 2.0) as f32))
            .unwrap();
        g.queue.submit([encoder.finish()]);
        host = reference::torch_clipped(&host, norm, norm / 2.0);
        want_norm = norm;
    }
    let report = pollster::block_on(set.read_report()).unwrap();
    assert_eq!(report.step, 5);
    assert!(
        common::rel_diff(report.total_norm as f64, want_norm) < 1e-5,
        "{report:?} vs {want_norm}"
    );

    // Recorded but not yet submitted: the latest submitted report stands.
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(1e9)).unwrap();
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 5);
    g.queue.submit([encoder.finish()]);
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 6);

    assert_close(
        &download(&g.device, &g.queue, &buffer, data.len()),
        &host,
        1e-5,
        "after 6 steps",
    );
    assert_no_wgpu_errors();
}

#[test]
fn a_pending_report_does_not_block_further_steps() {
    let g = gpu();
    let data = ramp(4096);
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[4096]).unwrap())
        .unwrap();
    let submit = |max_norm: f32| {
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(max_norm))
            .unwrap();
        g.queue.submit([encoder.finish()]);
    };
    submit(1e9);
    // One thread waits for a report while this one keeps recording and
    // submitting more steps than there are report buffers.
    let report = std::thread::scope(|scope| {
        let reader = scope.spawn(|| pollster::block_on(set.read_report()));
        for _ in 0..12 {
            submit(1e9);
        }
        reader.join().unwrap()
    })
    .unwrap();
    assert!((1..=13).contains(&report.step), "{report:?}");
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 13);
    assert_no_wgpu_errors();
}

#[test]
fn results_repeat_bit_for_bit() {
    let data: Vec<f32> = (0..300_000)
        .map(|i| ((i as f32) * 0.618).sin() * (1.0 + (i % 13) as f32))
        .collect();
    let sizes = [100_000, 7, 0, 199_993];
    for norm in [Norm::L2, Norm::Inf, Norm::L1, Norm::P(3.0)] {
        let clip = ClipNorm::new(1.0).norm(norm);
        let (first, after_first) = run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
        for _ in 0..2 {
            let (again, after_again) =
                run_clip(&data, &sizes, |set, enc| set.clip_norm(enc, &clip));
            let (a, b) = (first.clone().unwrap(), again.unwrap());
            assert_eq!(
                a.total_norm.to_bits(),
                b.total_norm.to_bits(),
                "{norm:?}: norm"
            );
            assert_eq!(
                a.coefficient.to_bits(),
                b.coefficient.to_bits(),
                "{norm:?}: coefficient"
            );
            assert_identical(&after_again, &after_first, &format!("{norm:?}: gradients"));
        }
    }
}

#[test]
fn value_clipping_keeps_nan_and_clamps_infinities() {
    let data = [
        0.5,
        -3.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        2.0,
        1e-40,
    ];
    let (_, after) = run_clip(&data, &[3, 5], |set, enc| set.clip_value(enc, -1.0, 1.0));
    assert_identical(
        &after,
        &[0.5, -1.0, f32::NAN, 1.0, -1.0, -0.0, 1.0, 1e-40],
        "clamp [-1, 1]",
    );
    let (_, after) = run_clip(&data, &[8], |set, enc| {
        set.clip_value(enc, f32::NEG_INFINITY, f32::INFINITY)
    });
    assert_identical(&after, &data, "clamp to the whole line");
}

#[test]
fn error_if_nonfinite_leaves_every_bit_alone() {
    let mut data = ramp(20_000);
    data[12_345] = f32::NEG_INFINITY;
    for norm in [Norm::L2, Norm::Inf, Norm::L1, Norm::P(0.5)] {
        let clip = ClipNorm::new(0.1).norm(norm).error_if_nonfinite(true);
        let (report, after) = run_clip(&data, &[12_000, 8_000], |set, enc| {
            set.clip_norm(enc, &clip)
        });
        assert_eq!(
            report,
            Err(Error::NonFinite {
                total_norm: f32::INFINITY
            }),
            "{norm:?}"
        );
        assert_identical(&after, &data, &format!("{norm:?}"));
    }
}
