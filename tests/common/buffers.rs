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

/// A gradient buffer holding `bytes` (f16/bf16 words, or f32 bit patterns),
/// then NaN words up to the next multiple of 16 bytes, which no pass may
/// read into a result or write.
///
/// Padded because a buffer that ends inside a 16-byte quad takes the
/// separate `F32Unaligned` element path, whose pipelines are compiled apart
/// from the aligned path's: with exact sizes, three in four of the tests'
/// random layouts compiled every pipeline they use twice, and compiles are
/// most of what the native suites spend on CPU drivers. tests/native/quads.rs
/// compares the two paths bit for bit (buffers from [`upload_exact`]).
pub fn upload_bytes(device: &wgpu::Device, bytes: &[u8]) -> wgpu::Buffer {
    let pad = bytes.len().next_multiple_of(16) - bytes.len();
    let mut padded = bytes.to_vec();
    padded.extend(PAD_WORD.to_le_bytes().iter().cycle().take(pad));
    upload_exact(device, &padded)
}

/// What [`upload_bytes`] pads with: a quiet NaN's bits (in 16-bit types, a
/// NaN's and a subnormal's), so that a pass that took padding into a norm
/// would show it.
pub const PAD_WORD: u32 = 0x7fc0_0001;

/// A gradient buffer of exactly `bytes`: one that ends inside a 16-byte quad
/// takes the `F32Unaligned` path for f32 gradients.
pub fn upload_exact(device: &wgpu::Device, bytes: &[u8]) -> wgpu::Buffer {
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
