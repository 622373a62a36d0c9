//! Bringing up burn's wgpu runtime on the adapter the environment names, so
//! that gradclip and burn share one device and queue.

use burn::backend::wgpu::WgpuSetup;
use burn::tensor::Device;

use crate::error::{Error, Result};

/// Creates a wgpu device on the adapter named by `WGPU_BACKEND` and
/// `WGPU_ADAPTER_NAME` (wgpu's own variables; cubecl's selection ignores
/// them), with every feature and limit of the adapter as cubecl requests
/// them, and registers it as burn's wgpu runtime. Returns the burn device
/// and the handles to give [`GradClipper::new`](crate::GradClipper::new).
///
/// Fails with [`Error::Adapter`] when no adapter is found. Call it once per
/// process: each call registers another runtime.
pub fn init_from_env() -> Result<(Device, WgpuSetup)> {
    let setup = pollster::block_on(setup_from_env())?;
    let device = Device::wgpu_options()
        .setup(setup.clone())
        .init()
        .map_err(|e| Error::Adapter(e.to_string()))?;
    Ok((device, setup))
}

async fn setup_from_env() -> Result<WgpuSetup> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = wgpu::util::initialize_adapter_from_env_or_default(&instance, None)
        .await
        .map_err(|e| Error::Adapter(format!("no wgpu adapter: {e}")))?;
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("burn + gradclip"),
            // What cubecl's WGSL runtime requests for a device it creates.
            required_features: adapter
                .features()
                .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            required_limits: adapter.limits(),
            memory_hints: wgpu::MemoryHints::MemoryUsage,
            trace: wgpu::Trace::Off,
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
        })
        .await
        .map_err(|e| Error::Adapter(format!("request_device: {e}")))?;
    let backend = adapter.get_info().backend;
    Ok(WgpuSetup {
        instance,
        adapter,
        device,
        queue,
        backend,
    })
}
