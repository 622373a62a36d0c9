//! Gradient clipping fused into the optimizer: gradclip computes the norm and
//! the coefficient (4 bytes read per element) and the SGD shader multiplies
//! each gradient by the coefficient as it loads it, instead of a scale pass
//! that reads and writes every gradient again (PyTorch: 12 bytes per element).
//!
//! `cargo run --release --example fused_sgd` checks the fused step against
//! clip-then-step on the default adapter.

#[path = "../support/readback.rs"]
mod readback;
mod sgd;

use readback::download;

use sgd::{FusedSgd, SgdBuffers, APPLY_COEFFICIENT};
use wgpu::util::DeviceExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    pollster::block_on(run())
}

fn buffer(device: &wgpu::Device, label: &str, data: &[f32]) -> wgpu::Buffer {
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytemuck::cast_slice(data),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
    })
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (device, queue, info) = gradclip::default_device().await?;
    println!("adapter: {} ({:?})", info.name, info.backend);
    let layout = gradclip::GradLayout::from_sizes(&[784 * 256, 256, 256 * 256, 256, 256 * 10, 10])?;
    let n = layout.total_elements() as usize;
    let grads: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect();
    let params: Vec<f32> = (0..n)
        .map(|i| ((i * 104_729 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let clip = gradclip::ClipNorm::new(1.0);
    let clipper = gradclip::Clipper::new(&device, &queue)?;

    // Fused: norm + coefficient only, then a step that multiplies on load.
    let fused = [
        buffer(&device, "fused params", &params),
        buffer(&device, "fused grads", &grads),
    ];
    let fused_velocity = buffer(&device, "fused velocity", &vec![0.0; n]);
    let fused_set = clipper.bind(&fused[1], &layout)?;
    let fused_sgd = FusedSgd::new(
        &device,
        SgdBuffers {
            params: &fused[0],
            grads: &fused[1],
            velocity: &fused_velocity,
            clip: fused_set.coefficient_binding(),
        },
        n as u32,
        0.1,
        0.9,
        APPLY_COEFFICIENT,
    );
    // Reference: clip the gradients in place, then a plain step.
    let plain = [
        buffer(&device, "plain params", &params),
        buffer(&device, "plain grads", &grads),
    ];
    let plain_velocity = buffer(&device, "plain velocity", &vec![0.0; n]);
    let plain_set = clipper.bind(&plain[1], &layout)?;
    let plain_sgd = FusedSgd::new(
        &device,
        SgdBuffers {
            params: &plain[0],
            grads: &plain[1],
            velocity: &plain_velocity,
            clip: plain_set.coefficient_binding(),
        },
        n as u32,
        0.1,
        0.9,
        0,
    );

    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("fused step"),
    });
    fused_set.record_norm(&mut encoder, &clip)?;
    fused_sgd.encode(&mut encoder);
    plain_set.clip_norm(&mut encoder, &clip)?;
    plain_sgd.encode(&mut encoder);
    queue.submit([encoder.finish()]);
    let report = fused_set.read_report().await?;

    let a = download(&device, &queue, &fused[0], n)?;
    let b = download(&device, &queue, &plain[0], n)?;
    let differing = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    println!(
        "{} parameters, gradient norm {:.4}, coefficient {:.6}",
        n, report.total_norm, report.coefficient
    );
    println!(
        "fused step: 4 B/element of clipping traffic (norm read); clip-then-step: 12 B/element"
    );
    println!("parameters differing bit-wise between fused and clip-then-step: {differing}");
    if differing != 0 {
        return Err("fused step differs from clip-then-step".into());
    }
    Ok(())
}
