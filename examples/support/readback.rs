//! Copying a buffer back to the host, for the examples' checks only: a
//! training loop never needs this (gradclip's reports are its readback).

type Error = Box<dyn std::error::Error>;

/// The first `len` floats of `buffer` (which needs `COPY_SRC`).
pub fn download(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    buffer: &wgpu::Buffer,
    len: usize,
) -> Result<Vec<f32>, Error> {
    let size = (len * 4) as u64;
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("example readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("example readback"),
    });
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
    queue.submit([encoder.finish()]);
    let (sender, receiver) = std::sync::mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        sender.send(r).unwrap_or(())
    });
    device.poll(wgpu::PollType::wait_indefinitely())?;
    receiver.recv()??;
    let data = bytemuck::cast_slice(&staging.get_mapped_range(..)?).to_vec();
    staging.unmap();
    Ok(data)
}
