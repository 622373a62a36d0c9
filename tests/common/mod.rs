//! Shared test support: the GPU device, upload and readback of gradient
//! buffers, the float64 reference and the golden data.
#![allow(dead_code)]

pub mod buffers;
pub mod checks;
pub mod golden;
pub mod reference;

use std::sync::OnceLock;

pub use buffers::upload;

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub clipper: gradclip::Clipper,
}

/// The adapter wgpu picks from the environment. No adapter is a failure,
/// never a skip: a test that cannot reach a GPU proves nothing.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let (device, queue, info) = pollster::block_on(gradclip::default_device())
            .unwrap_or_else(|e| panic!("no wgpu adapter for the GPU tests: {e}"));
        if let Ok(wanted) = std::env::var("WGPU_BACKEND") {
            let got = format!("{:?}", info.backend).to_lowercase();
            assert!(
                wanted
                    .to_lowercase()
                    .split(',')
                    .any(|w| got.starts_with(w.trim())),
                "WGPU_BACKEND={wanted} but the adapter is on {got}"
            );
        }
        eprintln!(
            "adapter: {} ({:?}, {:?})",
            info.name, info.backend, info.device_type
        );
        let clipper = gradclip::Clipper::new(&device, &queue).expect("Clipper::new");
        Gpu {
            device,
            queue,
            info,
            clipper,
        }
    })
}

pub fn download(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    buffer: &wgpu::Buffer,
    len: usize,
) -> Vec<f32> {
    if len == 0 {
        return Vec::new();
    }
    let staging = buffers::copy_for_readback(device, queue, buffer, len);
    staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map readback"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    buffers::read_mapped(&staging)
}

/// Runs `record` on a fresh encoder, submits it, and returns the report (or
/// the error) of the latest clip together with the gradients afterwards.
pub fn run_clip(
    data: &[f32],
    sizes: &[usize],
    record: impl FnOnce(&gradclip::GradSet, &mut wgpu::CommandEncoder) -> gradclip::Result<()>,
) -> (gradclip::Result<gradclip::ClipReport>, Vec<f32>) {
    let g = gpu();
    let buffer = upload(&g.device, data);
    let layout = gradclip::GradLayout::from_sizes(sizes).expect("layout");
    let set = g.clipper.bind(&buffer, &layout).expect("bind");
    let mut encoder = g.device.create_command_encoder(&Default::default());
    record(&set, &mut encoder).expect("record");
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report());
    (report, download(&g.device, &g.queue, &buffer, data.len()))
}
