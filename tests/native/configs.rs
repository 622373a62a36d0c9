//! Any number of distinct clip configurations per submission: each clip
//! sees its own max_norm / bounds, in one encoder or across encoders
//! submitted out of recording order.

use crate::common;

use common::reference::{assert_close, assert_identical};
use common::{assert_no_wgpu_errors, download, gpu, upload};
use gradclip::{ClipNorm, GradLayout};

const GRADS: [f32; 2] = [3.0, 4.0];

fn bound(data: &[f32]) -> (wgpu::Buffer, gradclip::GradSet) {
    let g = gpu();
    let buffer = upload(&g.device, data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[data.len()]).unwrap())
        .unwrap();
    (buffer, set)
}

#[test]
fn seventeen_max_norms_in_one_encoder() {
    let g = gpu();
    let (buffer, set) = bound(&GRADS);
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
    for k in 0..40 {
        set.clip_norm(&mut encoder, &ClipNorm::new(100.0 + k as f32))
            .unwrap();
    }
    g.queue.submit([encoder.finish()]);
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!(taken.reports.len(), 41);
    assert_eq!(taken.dropped, 0);
    let first = &taken.reports[0];
    assert_eq!(first.step, 1);
    assert_eq!(first.total_norm, 5.0);
    assert_eq!(first.coefficient, 1.0f32 / (5.0f32 + 1e-6));
    for r in &taken.reports[1..] {
        assert_eq!(r.coefficient, 1.0, "step {}", r.step);
    }
    let c = 1.0f32 / (5.0f32 + 1e-6);
    assert_identical(
        &download(&g.device, &g.queue, &buffer, 2),
        &[3.0 * c, 4.0 * c],
        "clipped once to norm 1, then left alone",
    );
    assert_no_wgpu_errors();
}

#[test]
fn a_max_norm_schedule_decreasing_per_clip() {
    // Each clip clips to its own, smaller max_norm: the last one wins.
    let g = gpu();
    let (buffer, set) = bound(&GRADS);
    let mut encoder = g.device.create_command_encoder(&Default::default());
    let schedule: Vec<f32> = (0..30).map(|k| 4.9 - 0.15 * k as f32).collect();
    for &m in &schedule {
        set.clip_norm(&mut encoder, &ClipNorm::tensorflow(m))
            .unwrap();
    }
    g.queue.submit([encoder.finish()]);
    let taken = pollster::block_on(set.take_reports()).unwrap();
    assert_eq!(taken.reports.len(), schedule.len());
    let mut previous = 5.0f64;
    for (r, &m) in taken.reports.iter().zip(&schedule) {
        assert_eq!(
            r.max_norm, m,
            "step {}: the report names its own max_norm",
            r.step
        );
        assert!(
            (r.total_norm as f64 - previous).abs() <= 1e-5 * previous,
            "step {}: norm {} after a clip to {previous}",
            r.step,
            r.total_norm
        );
        previous = m as f64;
    }
    let last = *schedule.last().unwrap() as f64;
    let want: Vec<f32> = GRADS
        .iter()
        .map(|&x| (x as f64 * last / 5.0) as f32)
        .collect();
    assert_close(
        &download(&g.device, &g.queue, &buffer, 2),
        &want,
        1e-5,
        "schedule",
    );
    assert_no_wgpu_errors();
}

#[test]
fn seventeen_value_bounds_in_one_encoder() {
    let g = gpu();
    let data = [3.0f32, -4.0, 0.25, 10.0];
    let (buffer, set) = bound(&data);
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_value(&mut encoder, -1.0, 1.0).unwrap();
    for k in 0..17 {
        let v = 50.0 + k as f32;
        set.clip_value(&mut encoder, -v, v).unwrap();
    }
    g.queue.submit([encoder.finish()]);
    assert_identical(
        &download(&g.device, &g.queue, &buffer, data.len()),
        &[1.0, -1.0, 0.25, 1.0],
        "the first, tightest bound applied",
    );
    assert_no_wgpu_errors();
}

#[test]
fn an_encoder_submitted_after_sixteen_others() {
    let g = gpu();
    let (buffer, set) = bound(&GRADS);
    let mut first = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut first, &ClipNorm::new(1.0)).unwrap();
    for k in 0..16 {
        let mut other = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut other, &ClipNorm::new(100.0 + k as f32))
            .unwrap();
        g.queue.submit([other.finish()]);
    }
    g.queue.submit([first.finish()]);
    let c = 1.0f32 / (5.0f32 + 1e-6);
    assert_identical(
        &download(&g.device, &g.queue, &buffer, 2),
        &[3.0 * c, 4.0 * c],
        "the late encoder's clip to norm 1",
    );
    // Step 1 ran last: its report is the one with the clip.
    let taken = pollster::block_on(set.take_reports()).unwrap();
    let step1 = taken.reports.iter().find(|r| r.step == 1).expect("step 1");
    assert_eq!(step1.coefficient, c);
    assert_eq!(taken.reports.len(), 17);
    assert_no_wgpu_errors();
}
