//! Reports: never lost silently, never invented for a step that did not
//! run, newest kept, reads that do not stall, memory only when asked for.

use crate::common;

use common::{assert_no_wgpu_errors, gpu, own_gpu, upload};
use gradclip::{ClipNorm, Error, GradLayout};

fn set_on(g: &common::Gpu, data: &[f32], sizes: &[usize]) -> (wgpu::Buffer, gradclip::GradSet) {
    let buffer = upload(&g.device, data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(sizes).unwrap())
        .unwrap();
    (buffer, set)
}

fn step(g: &common::Gpu, set: &gradclip::GradSet, max_norm: f32) {
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(max_norm))
        .unwrap();
    g.queue.submit([encoder.finish()]);
}

fn steps_of(reports: &gradclip::Reports) -> Vec<u64> {
    reports.reports.iter().map(|r| r.step).collect()
}

#[test]
fn dropped_encoders_cost_no_report_of_later_steps() {
    let g = gpu();
    let (_buffer, set) = set_on(g, &[3.0, 4.0], &[2]);
    // 20 encoders dropped unsubmitted, each holding a clip.
    for _ in 0..20 {
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
        drop(encoder);
    }
    for _ in 0..16 {
        step(g, &set, 10.0);
    }
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!(steps_of(&taken), (21..=36).collect::<Vec<u64>>());
    let latest = pollster::block_on(set.read_report()).unwrap();
    assert_eq!(latest.step, 36);
    assert_eq!(latest.total_norm, 5.0);
    assert_no_wgpu_errors();
}

#[test]
fn forty_clips_in_one_submission_report_every_step() {
    let g = gpu();
    let (_buffer, set) = set_on(g, &[3.0, 4.0], &[2]);
    let mut encoder = g.device.create_command_encoder(&Default::default());
    for _ in 0..40 {
        set.clip_norm(&mut encoder, &ClipNorm::new(10.0)).unwrap();
    }
    g.queue.submit([encoder.finish()]);
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 40);
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!(steps_of(&taken), (1..=40).collect::<Vec<u64>>());
    assert_eq!(taken.dropped, 0);
    assert_no_wgpu_errors();
}

#[test]
fn reports_of_a_hundred_steps_survive_read_report_in_between() {
    let g = gpu();
    let (_buffer, set) = set_on(g, &[3.0, 4.0], &[2]);
    for k in 1..=100u64 {
        step(g, &set, 10.0);
        assert_eq!(pollster::block_on(set.read_report()).unwrap().step, k);
    }
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!(steps_of(&taken), (1..=100).collect::<Vec<u64>>());
    assert_eq!(taken.dropped, 0);
    assert_no_wgpu_errors();
}

#[test]
fn unread_steps_beyond_the_log_are_counted_as_dropped() {
    let g = gpu();
    let (_buffer, set) = set_on(g, &[3.0, 4.0], &[2]);
    let log = gradclip::records::LOG_LEN;
    for _ in 0..log + 40 {
        step(g, &set, 10.0);
    }
    let taken = pollster::block_on(set.take_reports()).unwrap();
    // The newest LOG_LEN steps are kept, the 40 before them are counted.
    assert_eq!(steps_of(&taken), (41..=log + 40).collect::<Vec<u64>>());
    assert_eq!(taken.dropped, 40);
    // Counted once: the next take starts from zero.
    step(g, &set, 10.0);
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!((steps_of(&taken), taken.dropped), (vec![log + 41], 0));
    assert_no_wgpu_errors();
}

#[test]
fn a_step_run_after_a_newer_one_of_its_log_slot_is_counted() {
    // Steps are numbered when recorded, and threads submit in any order:
    // step 1 runs after steps 2 to LOG_LEN + 1, the last of which has its
    // log slot. One of the two reports is lost, and counted as dropped.
    let g = gpu();
    let (_buffer, set) = set_on(g, &[3.0, 4.0], &[2]);
    let log = gradclip::records::LOG_LEN;
    let mut first = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut first, &ClipNorm::new(10.0)).unwrap();
    for _ in 0..log {
        step(g, &set, 10.0);
    }
    g.queue.submit([first.finish()]);
    let latest = pollster::block_on(set.read_report()).unwrap();
    assert_eq!(latest.step, log + 1);
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!(steps_of(&taken), (2..=log + 1).collect::<Vec<u64>>());
    assert_eq!(taken.dropped, 1);
    assert_no_wgpu_errors();
}

#[test]
fn a_rejected_submission_makes_no_report() {
    // The gradient buffer destroyed between record and submit (a mapped one
    // is refused when recording; see tests/native/misuse.rs).
    let g = own_gpu();
    let buffer = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("gradients"),
        size: 8,
        usage: common::GRAD_USAGE,
        mapped_at_creation: false,
    });
    g.queue
        .write_buffer(&buffer, 0, bytemuck::cast_slice(&[3.0f32, 4.0]));
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[2]).unwrap())
        .unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
    g.queue.submit([encoder.finish()]);
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 1);

    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(0.5)).unwrap();
    buffer.destroy();
    g.queue.submit([encoder.finish()]); // wgpu rejects it: the user's error
    assert!(!g.errors.lock().unwrap().is_empty(), "wgpu accepted it");
    // Step 2 never ran: no report claims it did, and none is made of zeros.
    match pollster::block_on(set.read_report()) {
        Ok(r) => assert_eq!((r.step, r.total_norm), (1, 5.0), "{r:?}"),
        Err(e) => assert!(!matches!(e, Error::NoReport), "{e}"),
    }
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert!(
        taken
            .reports
            .iter()
            .all(|r| r.step == 1 && r.total_norm == 5.0),
        "{:?}",
        taken.reports
    );
}

#[test]
fn poll_reports_collects_without_waiting_for_the_device() {
    let g = gpu();
    let (_buffer, set) = set_on(g, &[3.0, 4.0], &[2]);
    // Nothing submitted: an immediate, empty answer.
    assert!(set.poll_reports().unwrap().reports.is_empty());
    // A clip recorded but not submitted yet: still nothing, still no wait.
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
    assert!(set.poll_reports().unwrap().reports.is_empty());
    g.queue.submit([encoder.finish()]);
    // Polling alone (no read_report, no device wait) brings it in.
    // (Bounded so that a poll that never makes progress fails instead of
    // hanging; slow drivers such as SwiftShader take a while.)
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while got.is_empty() && std::time::Instant::now() < deadline {
        got.extend(set.poll_reports().unwrap().reports);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(got.iter().map(|r| r.step).collect::<Vec<_>>(), [1]);
    assert_no_wgpu_errors();
}

#[test]
fn read_report_answers_for_submitted_steps_only() {
    let g = gpu();
    let (_buffer, set) = set_on(g, &[3.0, 4.0], &[2]);
    step(g, &set, 10.0);
    // Step 2 is recorded but its encoder is still open: read_report neither
    // waits for it nor reports it.
    let mut open = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut open, &ClipNorm::new(1.0)).unwrap();
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 1);
    g.queue.submit([open.finish()]);
    assert_eq!(pollster::block_on(set.read_report()).unwrap().step, 2);
    assert_no_wgpu_errors();
}

#[test]
fn per_tensor_report_memory_only_when_asked_for() {
    let g = gpu();
    let tensors = 200_000;
    let (_buffer, set) = set_on(g, &vec![1.0; tensors], &vec![1; tensors]);
    for _ in 0..5 {
        step(g, &set, 1.0);
    }
    pollster::block_on(set.take_reports()).unwrap();
    let (_, bytes) = set.readback_buffers();
    assert!(
        bytes < 64 * 1024,
        "{bytes} bytes of readback for global reports of 200 000 tensors"
    );
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(1.0).tensor_norms(true))
        .unwrap();
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();
    assert_eq!(report.tensor_norms.len(), tensors);
    let (_, bytes) = set.readback_buffers();
    assert!(bytes >= 16 * tensors as u64, "{bytes}");
    assert_no_wgpu_errors();
}
