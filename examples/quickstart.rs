//! Clips the gradients of a small transformer-sized layout on the default
//! adapter and checks the result against a float64 CPU reference.
//!
//! `cargo run --release --example quickstart` (set `WGPU_BACKEND=vulkan|gl`
//! or `WGPU_ADAPTER_NAME` to choose the adapter).

use std::time::Instant;

use wgpu::util::DeviceExt;

/// Tensor sizes of a 6-layer, 512-wide transformer block stack with
/// embeddings: 75 tensors, about 25 M parameters.
fn transformer_layout() -> Vec<usize> {
    let (d, ff, vocab, layers) = (512, 2048, 8000, 6);
    let mut sizes = vec![vocab * d, 1024 * d];
    for _ in 0..layers {
        sizes.extend([
            d,
            d,
            3 * d * d,
            3 * d,
            d * d,
            d,
            d,
            d,
            d * ff,
            ff,
            ff * d,
            d,
        ]);
    }
    sizes.extend([d, d, vocab]);
    sizes
}

/// A reproducible gradient: mostly small values, a few large ones.
fn gradient(n: usize) -> Vec<f32> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if x.is_multiple_of(1000) {
                u * 10.0
            } else {
                u * 1e-3
            }
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    pollster::block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (device, queue, info) = gradclip::default_device().await?;
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {})",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );

    let sizes = transformer_layout();
    let layout = gradclip::GradLayout::from_sizes(&sizes)?;
    let host = gradient(layout.total_elements() as usize);
    let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("quickstart gradients"),
        contents: bytemuck::cast_slice(&host),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
    });
    println!(
        "layout: {} tensors, {} elements",
        layout.len(),
        layout.total_elements()
    );

    let clipper = gradclip::Clipper::new(&device, &queue)?;
    let set = clipper.bind(&buffer, &layout)?;
    let clip = gradclip::ClipNorm::new(1.0);

    // One warm-up step on a copy would change the gradients; time the first clip end to end.
    let started = Instant::now();
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("quickstart clip"),
    });
    set.clip_norm(&mut encoder, &clip)?;
    queue.submit([encoder.finish()]);
    let report = set.read_report().await?;
    let elapsed = started.elapsed();

    let reference = host
        .iter()
        .map(|&g| (g as f64) * (g as f64))
        .sum::<f64>()
        .sqrt();
    let expected_coef = (1.0 / (reference + 1e-6)).min(1.0);
    let norm_error = (report.total_norm as f64 - reference).abs() / reference;
    let coef_error = (report.coefficient as f64 - expected_coef).abs() / expected_coef;
    println!(
        "total norm:  {:.6} (float64 reference {:.6}, relative error {:.1e})",
        report.total_norm, reference, norm_error
    );
    println!(
        "coefficient: {:.6e} (reference {:.6e}, relative error {:.1e})",
        report.coefficient, expected_coef, coef_error
    );
    println!(
        "elapsed:     {:.2} ms (record, submit, clip, read back)",
        elapsed.as_secs_f64() * 1e3
    );
    if norm_error > 1e-5 || coef_error > 1e-5 {
        return Err("GPU result disagrees with the float64 reference".into());
    }
    println!("check:       ok (within 1e-5 of the float64 reference)");
    Ok(())
}
