//! Small host-to-GPU uploads recorded into the caller's encoder.
//!
//! `queue.write_buffer` lands at the start of the next submission, before
//! commands recorded earlier but submitted later: a clip recorded into one
//! encoder would see the parameters of a clip recorded after it. So every
//! clip's parameters travel in its own command stream instead: written into
//! a small mapped staging buffer, copied by a command recorded into the
//! caller's encoder right before the passes that read them.
//!
//! A staging buffer belongs to one recorded copy until the GPU has done it:
//! `map_buffer_on_submit` maps it again for writing once the submission
//! completes, and hands it back then. If the encoder is dropped unsubmitted,
//! its deferred callback is dropped with it, and a guard inside the callback
//! hands the buffer back (unmapped, to be mapped again before reuse). The
//! pool grows only while more clips are recorded than the GPU has finished,
//! and never shrinks below what it reached.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::lock::lock;

/// Bytes of the smallest staging buffer (a `ClipConfig` fits); larger
/// uploads (a moved set's plan table) take buffers of the next power of two.
const STAGING_BYTES: u64 = 256;

/// The staging size for an upload of `len` bytes.
fn size_class(len: u64) -> u64 {
    len.next_power_of_two().max(STAGING_BYTES)
}

#[derive(Debug)]
enum State {
    /// Mapped for writing and not in use.
    Ready,
    /// Unmapped and not in use (its encoder was dropped): map before reuse.
    Unmapped,
    /// A map request is pending.
    Mapping,
    /// Holds a recorded copy that the GPU has not done yet.
    InFlight,
    /// Mapping failed (device lost): never used again.
    Broken,
}

#[derive(Debug)]
struct Staging {
    buffer: wgpu::Buffer,
    state: Arc<Mutex<State>>,
}

/// Returns a staging buffer to the pool when the callback that owns it is
/// dropped without being called (the encoder was dropped unsubmitted).
struct ReturnOnDrop {
    state: Arc<Mutex<State>>,
    called: bool,
}

impl Drop for ReturnOnDrop {
    fn drop(&mut self) {
        if !self.called {
            *lock(&self.state) = State::Unmapped;
        }
    }
}

/// The pool of staging buffers of one device.
#[derive(Debug)]
pub(crate) struct Uploads {
    device: wgpu::Device,
    pool: Mutex<Vec<Staging>>,
}

impl Uploads {
    pub fn new(device: &wgpu::Device) -> Self {
        Self {
            device: device.clone(),
            pool: Mutex::new(Vec::new()),
        }
    }

    /// Records into `encoder` a copy of `bytes` to `target` at `offset`; the
    /// copy runs where it stands in the command stream.
    pub fn upload(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        target: &wgpu::Buffer,
        offset: u64,
        bytes: &[u8],
    ) -> Result<()> {
        debug_assert!(bytes.len().is_multiple_of(4));
        let (buffer, state) = self.take(size_class(bytes.len() as u64))?;
        {
            let mut view = buffer
                .slice(..bytes.len() as u64)
                .get_mapped_range_mut()
                .map_err(|e| {
                    *lock(&state) = State::Broken;
                    Error::DeviceLost(e.to_string())
                })?;
            view.copy_from_slice(bytes);
        }
        buffer.unmap();
        encoder.copy_buffer_to_buffer(&buffer, 0, target, offset, bytes.len() as u64);
        let mut guard = ReturnOnDrop {
            state: state.clone(),
            called: false,
        };
        encoder.map_buffer_on_submit(&buffer, wgpu::MapMode::Write, .., move |result| {
            guard.called = true;
            *lock(&guard.state) = match result {
                Ok(()) => State::Ready,
                Err(_) => State::Broken,
            };
        });
        Ok(())
    }

    /// A mapped staging buffer of `size` bytes, marked in flight: a ready
    /// one, or a new one.
    fn take(&self, size: u64) -> Result<(wgpu::Buffer, Arc<Mutex<State>>)> {
        let mut pool = lock(&self.pool);
        pool.retain(|s| !matches!(*lock(&s.state), State::Broken));
        for staging in pool.iter() {
            let mut state = lock(&staging.state);
            match *state {
                State::Ready if staging.buffer.size() == size => {
                    *state = State::InFlight;
                    return Ok((staging.buffer.clone(), staging.state.clone()));
                }
                State::Unmapped => {
                    // Map it again for a later upload; the map completes on a
                    // later poll or submission.
                    *state = State::Mapping;
                    let shared = staging.state.clone();
                    staging
                        .buffer
                        .map_async(wgpu::MapMode::Write, .., move |result| {
                            *lock(&shared) = match result {
                                Ok(()) => State::Ready,
                                Err(_) => State::Broken,
                            };
                        });
                }
                _ => {}
            }
        }
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&format!("gradclip upload {}", pool.len())),
            size,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        let state = Arc::new(Mutex::new(State::InFlight));
        pool.push(Staging {
            buffer: buffer.clone(),
            state: state.clone(),
        });
        Ok((buffer, state))
    }
}
