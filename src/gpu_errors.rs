//! Turns wgpu errors raised while gradclip creates its objects into
//! [`Error::Wgpu`] instead of letting them reach the user's error handler.

#[cfg_attr(target_arch = "wasm32", allow(unused_imports))]
use crate::error::{Error, Result};

/// Error scopes around a group of object creations.
pub(crate) struct Catch {
    #[cfg(not(target_arch = "wasm32"))]
    scopes: (wgpu::ErrorScopeGuard, wgpu::ErrorScopeGuard),
}

impl Catch {
    pub fn begin(device: &wgpu::Device) -> Self {
        #[cfg(target_arch = "wasm32")]
        let _ = device;
        Self {
            #[cfg(not(target_arch = "wasm32"))]
            scopes: (
                device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
                device.push_error_scope(wgpu::ErrorFilter::Validation),
            ),
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
            let (oom, validation) = self.scopes;
            let first = pollster::block_on(validation.pop());
            let second = pollster::block_on(oom.pop());
            if let Some(e) = first.or(second) {
                return Err(Error::Wgpu(e.to_string()));
            }
        }
        Ok(())
    }
}
