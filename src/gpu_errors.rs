//! Turns wgpu errors raised while gradclip creates its objects into
//! [`Error::Wgpu`] instead of letting them reach the user's error handler.

#[cfg_attr(target_arch = "wasm32", allow(unused_imports))]
use crate::error::{Error, Result};

/// Error scopes around a group of object creations.
pub(crate) struct Catch {
    /// (validation, out-of-memory): the innermost scope first, because a
    /// tuple drops its fields in order and scopes must be popped innermost
    /// first when an early return drops the `Catch` before [`end`](Self::end).
    #[cfg(not(target_arch = "wasm32"))]
    scopes: (wgpu::ErrorScopeGuard, wgpu::ErrorScopeGuard),
}

impl Catch {
    pub fn begin(device: &wgpu::Device) -> Self {
        #[cfg(target_arch = "wasm32")]
        let _ = device;
        #[cfg(not(target_arch = "wasm32"))]
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        Self {
            #[cfg(not(target_arch = "wasm32"))]
            scopes: (device.push_error_scope(wgpu::ErrorFilter::Validation), oom),
        }
    }

    /// Pops the scopes. Natively wgpu-core reports errors synchronously, so
    /// the futures are already resolved and `block_on` does not wait. In the
    /// browser errors arrive asynchronously; no scope is pushed there, and
    /// errors go to the device's handler (the shaders are checked with naga
    /// and in Chromium by the test suite, so none is expected).
    pub fn end(self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (validation, oom) = self.scopes;
            let first = pollster::block_on(validation.pop());
            let second = pollster::block_on(oom.pop());
            if let Some(e) = first.or(second) {
                return Err(Error::Wgpu(e.to_string()));
            }
        }
        Ok(())
    }
}

/// Fails with [`Error::DeviceLost`] when `device` was destroyed or lost:
/// wgpu then makes every object invalid without a word (no error scope
/// reports it), and `create_buffer_init` panics on the mapped range.
pub(crate) fn check_alive(device: &wgpu::Device) -> Result<()> {
    init_buffer(
        device,
        "gradclip device check",
        &[0; 4],
        wgpu::BufferUsages::COPY_DST,
    )
    .map(drop)
}

/// `create_buffer_init` that returns an error instead of panicking when the
/// device is lost. `contents` is padded to a multiple of 4 bytes.
pub(crate) fn init_buffer(
    device: &wgpu::Device,
    label: &str,
    contents: &[u8],
    usage: wgpu::BufferUsages,
) -> Result<wgpu::Buffer> {
    let size = (contents.len() as u64).next_multiple_of(4).max(4);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage,
        mapped_at_creation: true,
    });
    {
        let mut view = buffer
            .get_mapped_range_mut(..)
            .map_err(|e| Error::DeviceLost(e.to_string()))?;
        view.slice(..contents.len()).copy_from_slice(contents);
    }
    buffer.unmap();
    Ok(buffer)
}

/// Fails with [`Error::ForeignDevice`] when what `record` puts in an
/// encoder of `device` does not validate there: natively, a throwaway
/// encoder is finished inside error scopes and its command buffer dropped,
/// never submitted. In the browser error scopes resolve asynchronously, so
/// nothing is checked there (wgpu reports a foreign object when the
/// caller's encoder is finished).
pub(crate) fn check_same_device(
    device: &wgpu::Device,
    what: &'static str,
    record: impl FnOnce(&mut wgpu::CommandEncoder),
) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let catch = Catch::begin(device);
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("gradclip device probe"),
        });
        record(&mut encoder);
        drop(encoder.finish());
        if catch.end().is_err() {
            return Err(Error::ForeignDevice { what });
        }
    }
    #[cfg(target_arch = "wasm32")]
    let _ = (device, what, record);
    Ok(())
}
