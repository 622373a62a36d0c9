//! The training demo in the browser: the same [`Trainer`] as the native CLI,
//! exported to the page's JavaScript (`web/app.js`) with wasm-bindgen. The
//! page draws the charts and runs the loop; each `step()` resolves once the
//! step's report is mapped, so the page's event loop runs between steps.
//!
//! Build: `examples/train/web/build.sh` (see docs/browser.md).
#![cfg(target_arch = "wasm32")]

mod model;
mod trainer;

use std::rc::Rc;

use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, js_sys::Promise};

use model::Config;
use trainer::{Adaptive, Mode, Trainer};

/// One step's report, as the page sees it (`trainer::StepReport`; `+inf`
/// is JavaScript's `Infinity`).
#[wasm_bindgen]
#[derive(Clone, Copy)]
pub struct Step {
    pub step: u32,
    pub loss: f32,
    pub grad_norm: f32,
    pub coefficient: f32,
    /// The max norm the step's clip used (`Infinity`: nothing clipped).
    pub threshold: f32,
    /// The smallest norm the step would have clipped (ZClip: its spike boundary).
    pub boundary: f32,
}

/// The trainer behind the page.
#[wasm_bindgen]
pub struct Demo {
    trainer: Rc<Trainer>,
}

/// Opens the browser's WebGPU adapter (WebGPU's default limits) and builds
/// the trainer. Resolves to a `Demo`.
#[wasm_bindgen]
pub async fn start_demo() -> Result<Demo, JsError> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::BROWSER_WEBGPU,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions::default())
        .await
        .map_err(|e| JsError::new(&format!("no WebGPU adapter: {e}")))?;
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("train demo device"),
            required_limits: wgpu::Limits::default(),
            ..Default::default()
        })
        .await
        .map_err(|e| JsError::new(&format!("request_device: {e}")))?;
    let trainer = Trainer::new(
        &device,
        &queue,
        adapter.get_info(),
        Config::default(),
        Adaptive::default(),
    )
    .map_err(|e| JsError::new(&e.to_string()))?;
    Ok(Demo {
        trainer: Rc::new(trainer),
    })
}

#[wasm_bindgen]
impl Demo {
    /// The adapter as wgpu describes it: its name (browsers may leave it
    /// empty), device type and back end.
    pub fn adapter(&self) -> String {
        let info = &self.trainer.info;
        let kind = format!("{:?}, {:?}", info.device_type, info.backend);
        if info.name.is_empty() {
            kind
        } else {
            format!("{} ({kind})", info.name)
        }
    }

    /// A one-line description of the model and the task.
    pub fn model(&self) -> String {
        let c = self.trainer.config();
        format!(
            "vanilla RNN, {} hidden units, sequences of {}, batch {}, {} parameters; \
             task: output the running sum of the inputs",
            c.hidden,
            c.seq_len,
            c.batch,
            c.param_count()
        )
    }

    /// The adaptive modes' settings, in words.
    pub fn adaptive(&self) -> String {
        let Adaptive { zclip, autoclip } = self.trainer.adaptive();
        format!(
            "ZClip: z-score above {}, EMA α {}, warm-up {} steps; AutoClip: {}th percentile of \
             the last {} norms",
            zclip.z_thresh, zclip.alpha, zclip.warmup_steps, autoclip.percentile, autoclip.window
        )
    }

    /// ZClip's warm-up: its first steps have no threshold.
    pub fn zclip_warmup(&self) -> u32 {
        self.trainer.adaptive().zclip.warmup_steps
    }

    pub fn lr(&self) -> f32 {
        self.trainer.config().lr
    }

    pub fn set_lr(&self, lr: f32) {
        self.trainer.set_lr(lr);
    }

    /// Initial weights, step 0.
    pub fn reset(&self) {
        self.trainer.reset();
    }

    /// Submits one step clipped in `mode` (`"none"`, `"fixed"` at
    /// `max_norm`, `"zclip"` or `"autoclip"`; switching to an adaptive mode
    /// starts it afresh) and resolves to its `Step` report. Await it before
    /// the next call.
    pub fn step(&self, mode: &str, max_norm: f32) -> Promise {
        let trainer = self.trainer.clone();
        let mode = mode.parse::<Mode>();
        future_to_promise(async move {
            let js = |e: trainer::TrainError| JsError::new(&e.to_string());
            trainer
                .submit_step(mode.map_err(js)?, max_norm)
                .map_err(js)?;
            let r = trainer.report().await.map_err(js)?;
            Ok(Step {
                step: r.step,
                loss: r.loss,
                grad_norm: r.grad_norm,
                coefficient: r.coefficient,
                threshold: r.threshold,
                boundary: r.boundary,
            }
            .into())
        })
    }
}
