//! Getting a device to clip on, for programs that do not bring their own.

use crate::error::{Error, Result};

/// Opens the adapter wgpu picks (honouring `WGPU_BACKEND`, `WGPU_ADAPTER_NAME`
/// and `WGPU_POWER_PREF`) and a device with that adapter's full limits, so
/// that large gradient buffers bind in few windows, and with
/// `SHADER_F16` where the adapter has it, so that f16 gradients are read
/// natively.
///
/// Fails with [`Error::Wgpu`] when no adapter is found: a machine without a
/// GPU still has one through Mesa (llvmpipe on GL, lavapipe on Vulkan).
///
/// ```
/// let (device, _queue, info) = pollster::block_on(gradclip::default_device())?;
/// println!("clipping on {} ({:?})", info.name, info.backend);
/// assert!(device.limits().max_compute_invocations_per_workgroup >= 256);
/// # Ok::<(), gradclip::Error>(())
/// ```
pub async fn default_device() -> Result<(wgpu::Device, wgpu::Queue, wgpu::AdapterInfo)> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = wgpu::util::initialize_adapter_from_env_or_default(&instance, None)
        .await
        .map_err(|e| Error::Wgpu(format!("no adapter: {e}")))?;
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("gradclip device"),
            required_limits: adapter.limits(),
            required_features: adapter.features() & wgpu::Features::SHADER_F16,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::Wgpu(format!("request_device: {e}")))?;
    Ok((device, queue, adapter.get_info()))
}
