//! The `Gradients` class: a gradient buffer this package made for a layout,
//! bound to gradclip; every clip is recorded and submitted on the shared
//! queue when it is called.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use js_sys::{Array, Promise, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, spawn_local};

use super::clipper::{tensor_fields, Shared};
use super::errors::{destroyed, error, invalid_options};
use super::js::{numbers, object};
use super::options;
use crate::core_api::{self, Bound, Report, Reports};
use crate::layout::Placement;

struct State {
    shared: Rc<Shared>,
    buffer: wgpu::Buffer,
    js_buffer: JsValue,
    /// `{ buffer, offset, size }` of the ClipState record.
    js_coefficient_binding: JsValue,
    placement: Placement,
    names: Option<Vec<String>>,
    /// `None` after `destroy()`. Pending report promises hold their own `Rc`.
    bound: RefCell<Option<Rc<Bound>>>,
    /// The first WebGPU validation error of a submission of ours, thrown
    /// by the next call.
    gpu_error: Rc<RefCell<Option<String>>>,
}

/// Gradients in one `GPUBuffer` that JavaScript shaders write, clipped by gradclip.
#[wasm_bindgen(js_name = Gradients)]
pub struct JsGradients {
    state: Rc<State>,
}

fn webgpu_buffer(buffer: &wgpu::Buffer) -> Result<JsValue, JsValue> {
    buffer
        .as_webgpu()
        .map(|b| JsValue::from(b.clone()))
        .ok_or_else(|| error("NO_WEBGPU", "the buffer is not a WebGPU buffer"))
}

fn binding(buffer: &JsValue, offset: u64, size: u64) -> JsValue {
    object(&[
        ("buffer", buffer.clone()),
        ("offset", (offset as f64).into()),
        ("size", (size as f64).into()),
    ])
}

impl JsGradients {
    pub(super) fn new(
        shared: Rc<Shared>,
        buffer: wgpu::Buffer,
        placement: Placement,
        names: Option<Vec<String>>,
        bound: Bound,
    ) -> Result<Self, JsValue> {
        let js_buffer = webgpu_buffer(&buffer)?;
        let (stats, offset, size) = bound.coefficient_binding();
        let js_coefficient_binding = binding(&webgpu_buffer(stats)?, offset, size);
        Ok(Self {
            state: Rc::new(State {
                shared,
                buffer,
                js_buffer,
                js_coefficient_binding,
                placement,
                names,
                bound: RefCell::new(Some(Rc::new(bound))),
                gpu_error: Rc::new(RefCell::new(None)),
            }),
        })
    }
}

impl State {
    fn bound(&self) -> Result<Rc<Bound>, JsValue> {
        if self.shared.destroyed.get() {
            return Err(destroyed("Gradients"));
        }
        self.bound
            .borrow()
            .clone()
            .ok_or_else(|| destroyed("Gradients"))
    }

    /// The step number of the latest recorded norm clip (its report's).
    fn step(&self) -> Result<f64, JsValue> {
        Ok(self.bound()?.steps_recorded() as f64)
    }

    fn reports(&self, taken: &Reports) -> JsValue {
        let reports: Array = taken.reports.iter().map(|r| self.report(r)).collect();
        object(&[
            ("reports", reports.into()),
            ("dropped", (taken.dropped as f64).into()),
            (
                "tensorNormsMissed",
                (taken.tensor_norms_missed as f64).into(),
            ),
        ])
    }

    fn check_gpu_error(&self) -> Result<(), JsValue> {
        match self.gpu_error.borrow_mut().take() {
            Some(message) => Err(error("GPU_VALIDATION", message)),
            None => Ok(()),
        }
    }

    /// Records with `record` into an encoder of its own and submits it,
    /// inside a validation error scope whose result the next call reports.
    fn submit(
        &self,
        label: &'static str,
        record: impl FnOnce(&Bound, &mut wgpu::CommandEncoder) -> core_api::Result<()>,
    ) -> Result<(), JsValue> {
        let bound = self.bound()?;
        self.check_gpu_error()?;
        let device = &self.shared.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        let recorded = record(&bound, &mut encoder);
        // A rejected call recorded nothing; its encoder is dropped unfinished.
        if recorded.is_ok() {
            self.shared.queue.submit([encoder.finish()]);
        }
        let popped = scope.pop();
        let slot = self.gpu_error.clone();
        spawn_local(async move {
            if let Some(e) = popped.await {
                slot.borrow_mut()
                    .get_or_insert_with(|| format!("{label}: {e}"));
            }
        });
        recorded.map_err(JsValue::from)
    }

    fn report(&self, r: &Report) -> JsValue {
        let mut fields = vec![
            ("step", (r.step as f64).into()),
            ("totalNorm", (r.total_norm as f64).into()),
            ("coefficient", (r.coefficient as f64).into()),
            ("nonfinite", r.nonfinite.into()),
            ("foundInf", r.found_inf.into()),
            ("invalidPartial", r.invalid_partial.into()),
            ("unscaledBy", (r.unscaled_by as f64).into()),
            ("lossScale", (r.loss_scale as f64).into()),
            ("growthTracker", r.growth_tracker.into()),
            ("partial", Uint8Array::from(&r.partial[..]).into()),
            ("tensorNorms", numbers(r.tensor_norms.iter().copied())),
            (
                "tensorCoefficients",
                numbers(r.tensor_coefficients.iter().copied()),
            ),
        ];
        if let (Some(names), false) = (&self.names, r.tensor_norms.is_empty()) {
            let named: Vec<(&str, JsValue)> = names
                .iter()
                .zip(&r.tensor_norms)
                .map(|(n, &v)| (n.as_str(), JsValue::from_f64(v as f64)))
                .collect();
            fields.push(("namedNorms", object(&named)));
        }
        object(&fields)
    }

    fn tensor_index(&self, tensor: &JsValue) -> Result<usize, JsValue> {
        let count = self.placement.tensors.len();
        if let Some(i) = tensor.as_f64() {
            if i.fract() == 0.0 && i >= 0.0 && (i as usize) < count {
                return Ok(i as usize);
            }
            return Err(error(
                "UNKNOWN_TENSOR",
                format!("tensorBinding: no tensor {i} (the layout has {count})"),
            ));
        }
        if let Some(name) = tensor.as_string() {
            return self
                .names
                .as_ref()
                .and_then(|names| names.iter().position(|n| *n == name))
                .ok_or_else(|| {
                    error(
                        "UNKNOWN_TENSOR",
                        format!("tensorBinding: no tensor named {name:?}"),
                    )
                });
        }
        Err(invalid_options(
            "tensorBinding",
            "the tensor must be an index or a name",
        ))
    }
}

#[wasm_bindgen(js_class = Gradients)]
impl JsGradients {
    /// The `GPUBuffer` holding every tensor (usage `STORAGE | COPY_SRC | COPY_DST`).
    #[wasm_bindgen(getter, unchecked_return_type = "GPUBuffer")]
    pub fn buffer(&self) -> JsValue {
        self.state.js_buffer.clone()
    }

    /// `"f32"`, `"f16"` or `"bf16"`.
    #[wasm_bindgen(getter)]
    pub fn dtype(&self) -> String {
        self.state.placement.dtype.name().into()
    }

    /// Size of the buffer in bytes.
    #[wasm_bindgen(getter, js_name = byteLength)]
    pub fn byte_length(&self) -> f64 {
        self.state.placement.buffer_bytes as f64
    }

    /// One `{ name?, elements, offset, byteOffset, byteLength }` per tensor,
    /// in layout order (`offset` counts elements of `dtype`).
    #[wasm_bindgen(getter)]
    pub fn tensors(&self) -> Array {
        let s = &self.state;
        s.placement
            .tensors
            .iter()
            .enumerate()
            .map(|(i, place)| {
                let name = s.names.as_ref().map(|n| n[i].as_str());
                object(&tensor_fields(name, place, s.placement.dtype))
            })
            .collect()
    }

    /// A `GPUBufferBinding` of one tensor (by index or name): its bytes
    /// rounded up to a whole 4-byte word.
    #[wasm_bindgen(js_name = tensorBinding, unchecked_return_type = "GPUBufferBinding")]
    pub fn tensor_binding(&self, tensor: JsValue) -> Result<JsValue, JsValue> {
        let s = &self.state;
        let place = s.placement.tensors[s.tensor_index(&tensor)?];
        Ok(binding(
            &s.js_buffer,
            place.byte_offset,
            place.binding_bytes(s.placement.dtype),
        ))
    }

    /// The `GPUBufferBinding` of the clip state (WGSL: `CLIP_STATE_WGSL`),
    /// for an optimizer shader that multiplies by the coefficient on load.
    #[wasm_bindgen(getter, js_name = coefficientBinding, unchecked_return_type = "GPUBufferBinding")]
    pub fn coefficient_binding(&self) -> JsValue {
        self.state.js_coefficient_binding.clone()
    }

    /// Records and submits a norm clip; returns its step number.
    #[wasm_bindgen(js_name = clipNorm)]
    pub fn clip_norm(&self, options: JsValue) -> Result<f64, JsValue> {
        let spec = options::norm("clipNorm", options, None)?;
        self.state
            .submit("gradclip clipNorm", |b, e| b.clip_norm(e, &spec))?;
        self.state.step()
    }

    /// Records and submits the norm and coefficient without scaling;
    /// returns its step number.
    #[wasm_bindgen(js_name = recordNorm)]
    pub fn record_norm(&self, options: JsValue) -> Result<f64, JsValue> {
        let spec = options::norm("recordNorm", options, Some(f32::MAX))?;
        self.state
            .submit("gradclip recordNorm", |b, e| b.record_norm(e, &spec))?;
        self.state.step()
    }

    /// Records and submits a norm clip with a norm combined elsewhere: the
    /// 16-byte partial of every shard together (`combinePartials` of each
    /// shard's `readPartial`); returns its step number.
    #[wasm_bindgen(js_name = clipWithPartial)]
    pub fn clip_with_partial(&self, options: JsValue, partial: JsValue) -> Result<f64, JsValue> {
        let spec = options::norm("clipWithPartial", options, None)?;
        let bytes = options::partial_bytes("clipWithPartial", &partial)?;
        self.state.submit("gradclip clipWithPartial", |b, e| {
            b.clip_with_partial(e, &spec, bytes)
        })?;
        self.state.step()
    }

    /// Resolves to `{ step, partial }`: the latest norm clip's 16-byte
    /// share of the norm. The copy is submitted when this is called.
    #[wasm_bindgen(js_name = readPartial, unchecked_return_type = "Promise<{ step: number, partial: Uint8Array }>")]
    pub fn read_partial(&self) -> Promise {
        let state = self.state.clone();
        let bound = match state.bound() {
            Ok(bound) => bound,
            Err(e) => return Promise::reject(&e),
        };
        // The core submits the copy when `read_partial` is called, which an
        // async block does on its first poll: poll it once now, so that the
        // copy goes ahead of whatever the caller submits next.
        let mut read = Box::pin(async move { bound.read_partial().await });
        let first = read.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        future_to_promise(async move {
            let (step, partial) = match first {
                Poll::Ready(result) => result?,
                Poll::Pending => read.await?,
            };
            state.check_gpu_error()?;
            Ok(object(&[
                ("step", (step as f64).into()),
                ("partial", Uint8Array::from(&partial[..]).into()),
            ]))
        })
    }

    /// Records and submits value clipping (every element clamped).
    #[wasm_bindgen(js_name = clipValue)]
    pub fn clip_value(&self, options: JsValue) -> Result<(), JsValue> {
        let (min, max) = options::value_range(options)?;
        self.state
            .submit("gradclip clipValue", |b, e| b.clip_value(e, min, max))
    }

    /// Sets GradScaler's parameters and resets the loss scale.
    #[wasm_bindgen(js_name = setLossScaler)]
    pub fn set_loss_scaler(&self, options: JsValue) -> Result<(), JsValue> {
        let spec = options::scaler(options)?;
        self.state.bound()?.set_loss_scaler(&spec)?;
        Ok(())
    }

    /// `{ reports, dropped, tensorNormsMissed }` of the reports whose
    /// readback came back, now, without waiting; starts a readback of the
    /// steps submitted since the last one, for a later call.
    #[wasm_bindgen(js_name = pollReports, unchecked_return_type = "Reports")]
    pub fn poll_reports(&self) -> Result<JsValue, JsValue> {
        let bound = self.state.bound()?;
        let taken = bound.poll_reports()?;
        self.state.check_gpu_error()?;
        Ok(self.state.reports(&taken))
    }

    /// Resolves to `{ reports, dropped, tensorNormsMissed }`: every report
    /// since the last collection, once a copy of the report log submitted
    /// now is back. Later submissions go on meanwhile.
    #[wasm_bindgen(unchecked_return_type = "Promise<Reports>")]
    pub fn reports(&self) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            let bound = state.bound()?;
            let taken = bound.take_reports().await?;
            state.check_gpu_error()?;
            Ok(state.reports(&taken))
        })
    }

    /// Resolves to the report of the latest submitted norm clip.
    #[wasm_bindgen(js_name = latestReport, unchecked_return_type = "Promise<ClipReport>")]
    pub fn latest_report(&self) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            let bound = state.bound()?;
            let report = bound.latest_report().await?;
            state.check_gpu_error()?;
            Ok(state.report(&report))
        })
    }

    /// Destroys the gradient buffer and releases the bindings; later calls
    /// fail with `DESTROYED`.
    pub fn destroy(&self) {
        if self.state.bound.borrow_mut().take().is_some() {
            self.state.buffer.destroy();
        }
    }
}
