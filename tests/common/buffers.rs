//! Gradient buffers for the tests, native and browser alike.

use wgpu::util::DeviceExt;

pub const GRAD_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

pub fn upload(device: &wgpu::Device, data: &[f32]) -> wgpu::Buffer {
    // wgpu rejects empty buffers in bindings; keep at least one element.
    let bytes: &[u8] = if data.is_empty() {
        &[0; 4]
    } else {
        bytemuck::cast_slice(data)
    };
    upload_bytes(device, bytes)
}

/// A gradient buffer holding `bytes` (f16/bf16 words, or f32 bit patterns).
pub fn upload_bytes(device: &wgpu::Device, bytes: &[u8]) -> wgpu::Buffer {
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("test gradients"),
        contents: bytes,
        usage: GRAD_USAGE,
    })
}

/// Submits a copy of the first `len` floats of `buffer` into a new mappable
/// buffer and returns it; map it, then read it with [`read_mapped`].
pub fn copy_for_readback(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    buffer: &wgpu::Buffer,
    len: usize,
) -> wgpu::Buffer {
    let size = (len * 4) as u64;
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("test readback"),
    });
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
    queue.submit([encoder.finish()]);
    staging
}

/// The floats of a mapped readback buffer; unmaps it.
pub fn read_mapped(staging: &wgpu::Buffer) -> Vec<f32> {
    let out = bytemuck::cast_slice(&staging.get_mapped_range(..).expect("mapped range")).to_vec();
    staging.unmap();
    out
}
