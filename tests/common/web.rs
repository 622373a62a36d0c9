//! The browser side of the shared test support (wasm32 only): a WebGPU
//! device with WebGPU's default limits, uploads, and `map_async` readbacks
//! awaited on the browser's event loop.

use std::sync::Arc;

use futures_intrusive::sync::ManualResetEvent;
use wgpu::util::DeviceExt;

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
}

/// The browser's WebGPU adapter, opened with WebGPU's default limits and no
/// optional feature: what gradclip promises to run within. No adapter (or
/// one that is not WebGPU) fails the test.
pub async fn gpu() -> Gpu {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::BROWSER_WEBGPU,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions::default())
        .await
        .unwrap_or_else(|e| panic!("no WebGPU adapter in this browser: {e}"));
    let info = adapter.get_info();
    assert_eq!(info.backend, wgpu::Backend::BrowserWebGpu, "{info:?}");
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("browser test device"),
            required_features: wgpu::Features::empty(),
            required_limits: wgpu::Limits::default(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("request_device: {e}"));
    let limits = device.limits();
    assert_eq!(limits.max_compute_invocations_per_workgroup, 256);
    assert_eq!(limits.max_storage_buffers_per_shader_stage, 8);
    assert_eq!(limits.max_storage_buffer_binding_size, 128 << 20);
    Gpu {
        device,
        queue,
        info,
    }
}

pub const GRAD_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

pub fn upload(device: &wgpu::Device, data: &[f32]) -> wgpu::Buffer {
    // Bindings cannot be empty; keep at least one element.
    let bytes: &[u8] = if data.is_empty() {
        &[0; 4]
    } else {
        bytemuck::cast_slice(data)
    };
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("browser test gradients"),
        contents: bytes,
        usage: GRAD_USAGE,
    })
}

/// Copies `len` floats of `buffer` back with `map_async`, awaiting the
/// callback (the browser runs it from its event loop).
pub async fn download(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    buffer: &wgpu::Buffer,
    len: usize,
) -> Vec<f32> {
    if len == 0 {
        return Vec::new();
    }
    let size = (len * 4) as u64;
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("browser test readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("browser test readback"),
    });
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
    queue.submit([encoder.finish()]);
    let done = Arc::new(ManualResetEvent::new(false));
    let signal = done.clone();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        r.expect("map readback");
        signal.set();
    });
    done.wait().await;
    let out = bytemuck::cast_slice(&staging.get_mapped_range(..).expect("mapped range")).to_vec();
    staging.unmap();
    out
}
