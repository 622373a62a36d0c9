//! `createClipper()` and the `Clipper` class: the device this package
//! creates and shares with JavaScript, and the gradient buffers it makes.

use std::cell::Cell;
use std::collections::HashSet;
use std::rc::Rc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::errors::{destroyed, error, invalid_options, layout_error};
use super::gradients::JsGradients;
use super::js::{object, Fields};
use super::options::{self, Limits};
use crate::core_api::Engine;
use crate::layout;

/// What a `Clipper` and its `Gradients` share.
pub(super) struct Shared {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// `device.as_webgpu()`, taken once.
    pub js_device: JsValue,
    pub info: wgpu::AdapterInfo,
    pub engine: Engine,
    pub destroyed: Cell<bool>,
}

/// Runs `f` (object creation) inside validation and out-of-memory error
/// scopes and turns what they caught into a rejected promise, so that
/// nothing of ours reaches the device's `uncapturederror` handler. Both
/// scopes are pushed and popped before this returns its first `await`, so
/// they nest correctly inside any scope JavaScript has open.
pub(super) async fn caught<T>(
    device: &wgpu::Device,
    what: &str,
    f: impl FnOnce() -> T,
) -> Result<T, JsValue> {
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    let validation = validation.pop();
    let oom = oom.pop();
    if let Some(e) = validation.await {
        return Err(error("GPU_ERROR", format!("{what}: {e}")));
    }
    if let Some(e) = oom.await {
        return Err(error("OUT_OF_MEMORY", format!("{what}: {e}")));
    }
    Ok(value)
}

/// Requests a WebGPU adapter and device, and makes gradclip's pipelines on
/// it. Resolves to a `Clipper`.
#[wasm_bindgen(js_name = createClipper)]
pub async fn create_clipper(options: JsValue) -> Result<JsClipper, JsValue> {
    let o = options::create(options)?;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::BROWSER_WEBGPU,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: o.power_preference,
            ..Default::default()
        })
        .await
        .map_err(|e| error("NO_WEBGPU", format!("no WebGPU adapter: {e}")))?;
    let offered = adapter.features();
    let required_features = match o.required_features {
        // f16 gradients are then read natively, and JS shaders may `enable f16;`.
        None => offered & wgpu::Features::SHADER_F16,
        Some(list) => {
            let mut features = wgpu::Features::empty();
            for (name, feature) in list {
                if !offered.contains(feature) {
                    return Err(error(
                        "UNSUPPORTED_FEATURE",
                        format!("createClipper: the adapter does not offer {name:?}"),
                    ));
                }
                features |= feature;
            }
            features
        }
    };
    let required_limits = match o.limits {
        Limits::Adapter => adapter.limits(),
        Limits::Default => wgpu::Limits::default(),
    };
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("gradclip device"),
            required_features,
            required_limits,
            ..Default::default()
        })
        .await
        .map_err(|e| error("NO_WEBGPU", format!("requestDevice failed: {e}")))?;
    let js_device = match device.as_webgpu() {
        Some(d) => JsValue::from(d.clone()),
        None => return Err(error("NO_WEBGPU", "the device is not a WebGPU device")),
    };
    let engine = caught(&device, "creating gradclip's pipelines", || {
        Engine::new(&device, &queue)
    })
    .await??;
    Ok(JsClipper {
        shared: Rc::new(Shared {
            device,
            queue,
            js_device,
            info: adapter.get_info(),
            engine,
            destroyed: Cell::new(false),
        }),
    })
}

/// The device and gradclip's pipelines on it.
#[wasm_bindgen(js_name = Clipper)]
pub struct JsClipper {
    shared: Rc<Shared>,
}

#[wasm_bindgen(js_class = Clipper)]
impl JsClipper {
    /// The `GPUDevice`, for JavaScript's own buffers, pipelines and submissions.
    #[wasm_bindgen(getter, unchecked_return_type = "GPUDevice")]
    pub fn device(&self) -> JsValue {
        self.shared.js_device.clone()
    }

    /// The adapter as wgpu describes it.
    #[wasm_bindgen(getter, js_name = adapterInfo)]
    pub fn adapter_info(&self) -> JsValue {
        let info = &self.shared.info;
        object(&[
            ("name", info.name.as_str().into()),
            ("deviceType", format!("{:?}", info.device_type).into()),
            ("driver", info.driver.as_str().into()),
            ("driverInfo", info.driver_info.as_str().into()),
            ("backend", format!("{:?}", info.backend).into()),
        ])
    }

    /// Whether f16 gradients are read as WGSL `f16` (the device has
    /// `shader-f16`) rather than decoded from 32-bit words.
    #[wasm_bindgen(getter, js_name = f16Native)]
    pub fn f16_native(&self) -> bool {
        self.shared.engine.f16_native()
    }

    /// Creates a gradient buffer for a layout and binds it. Resolves to a
    /// `Gradients`.
    #[wasm_bindgen(js_name = createGradients, unchecked_return_type = "Promise<Gradients>")]
    pub fn create_gradients(&self, options: JsValue) -> Promise {
        let shared = self.shared.clone();
        future_to_promise(async move {
            if shared.destroyed.get() {
                return Err(destroyed("Clipper"));
            }
            let o = options::gradients(options)?;
            if let Some(names) = &o.names {
                let mut seen = HashSet::new();
                if let Some(twice) = names.iter().find(|n| !seen.insert(n.as_str())) {
                    return Err(invalid_options(
                        "createGradients",
                        format!("the tensor name {twice:?} appears twice"),
                    ));
                }
            }
            let placement = layout::place(&o.sizes, o.dtype, o.align).map_err(layout_error)?;
            let max = shared.device.limits().max_buffer_size;
            if placement.buffer_bytes > max {
                return Err(error(
                    "TOO_LARGE",
                    format!(
                        "createGradients: the layout needs a buffer of {} bytes, the device allows {max}",
                        placement.buffer_bytes
                    ),
                ));
            }
            let device = &shared.device;
            let (buffer, bound) = caught(device, "creating the gradient buffer", || {
                let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&o.label),
                    size: placement.buffer_bytes,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                let bound = shared.engine.bind(&buffer, &placement, o.names.as_deref());
                (buffer, bound)
            })
            .await?;
            let bound = match bound {
                Ok(bound) => bound,
                Err(e) => {
                    buffer.destroy();
                    return Err(e.into());
                }
            };
            Ok(JsGradients::new(shared.clone(), buffer, placement, o.names, bound)?.into())
        })
    }

    /// Destroys the device (`GPUDevice.destroy()`): every buffer on it,
    /// JavaScript's included, and every `Gradients` of this clipper.
    pub fn destroy(&self) {
        if !self.shared.destroyed.replace(true) {
            self.shared.device.destroy();
        }
    }
}

/// The fields of the tensor descriptions, shared with `Gradients`.
pub(super) fn tensor_fields(
    name: Option<&str>,
    place: &layout::TensorPlace,
    dtype: layout::Dtype,
) -> Fields {
    let mut fields: Fields = Vec::with_capacity(5);
    if let Some(name) = name {
        fields.push(("name", name.into()));
    }
    fields.push(("elements", (place.elements as f64).into()));
    fields.push((
        "offset",
        ((place.byte_offset / dtype.bytes()) as f64).into(),
    ));
    fields.push(("byteOffset", (place.byte_offset as f64).into()));
    fields.push(("byteLength", (place.bytes(dtype) as f64).into()));
    fields
}
