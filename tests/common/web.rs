//! The browser side of the shared test support (wasm32 only): a WebGPU
//! device with WebGPU's default limits, uploads, and `map_async` readbacks
//! awaited on the browser's event loop.

use std::sync::Arc;

use futures_intrusive::sync::ManualResetEvent;

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

pub use super::buffers::upload;

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
    let staging = super::buffers::copy_for_readback(device, queue, buffer, len);
    let done = Arc::new(ManualResetEvent::new(false));
    let signal = done.clone();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        r.expect("map readback");
        signal.set();
    });
    done.wait().await;
    super::buffers::read_mapped(&staging)
}
