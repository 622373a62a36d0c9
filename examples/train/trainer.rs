//! The demo's GPU training loop, shared by the native CLI and the web page:
//! every buffer, pipeline and bind group is made once in [`Trainer::new`]
//! (gradclip's adaptive clips too); a step records four passes and
//! gradclip's clip into one encoder, and the only things read back are the
//! step's small reports, after the step is submitted.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use futures_intrusive::sync::ManualResetEvent;
use gradclip::{AdaptiveClip, AutoClip, ClipNorm, Clipper, GradLayout, GradSet, ZClip};
use wgpu::util::DeviceExt;

use crate::model::Config;

const SHADER: &str = include_str!("rnn.wgsl");
/// `PER_PARAM_WG` in `rnn.wgsl`.
const PER_PARAM_WG: u32 = 64;
/// Bytes of `Stats` that the report reads: `step` and `loss`.
const REPORT_BYTES: u64 = 8;

/// `Dims` in `rnn.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Dims {
    batch: u32,
    seq_len: u32,
    loss_from: u32,
    param_count: u32,
    seed: u32,
    lr: f32,
    _pad: [u32; 2],
}

/// How a step clips its gradients before the SGD update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No clipping (gradclip still measures the norm, and leaves the gradients alone).
    None,
    /// A fixed max norm (PyTorch's `clip_grad_norm_`).
    Fixed,
    /// ZClip: clips a norm whose z-score against an EMA of past norms is too high.
    ZClip,
    /// AutoClip: clips to a percentile of the norms seen so far.
    AutoClip,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::None, Mode::Fixed, Mode::ZClip, Mode::AutoClip];

    /// The name the CLI and the page use.
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Fixed => "fixed",
            Mode::ZClip => "zclip",
            Mode::AutoClip => "autoclip",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Mode {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self, TrainError> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| TrainError::UnknownMode(s.to_string()))
    }
}

/// What can go wrong in the demo's training loop.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Gradclip(#[from] gradclip::Error),
    #[error("reading the step's loss back failed: {0}")]
    Readback(String),
    #[error("unknown clipping mode {0:?} (none, fixed, zclip or autoclip)")]
    UnknownMode(String),
    #[error("the fixed max norm must be positive and finite, got {0}")]
    InvalidMaxNorm(f32),
}

/// The adaptive methods' settings, fixed when the trainer is made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    pub zclip: ZClip,
    pub autoclip: AutoClip,
}

impl Default for Adaptive {
    /// The papers' defaults except ZClip's warm-up: 10 steps rather than
    /// 25, so that ZClip clips within the demo's short runs (CI's 50 steps,
    /// the page test's 100). AutoClip keeps the paper's 10th percentile, with
    /// a window longer than the demo's runs (all of history, as in the paper).
    fn default() -> Self {
        Self {
            zclip: ZClip::new().warmup_steps(10),
            autoclip: AutoClip::new(10.0).window(1000),
        }
    }
}

/// What one training step reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Steps completed, counting from 1.
    pub step: u32,
    /// How the step clipped.
    pub mode: Mode,
    /// Mean squared error of the step's batch, before its update.
    pub loss: f32,
    /// Global L2 norm of the gradients before clipping (NaN or inf once training diverged).
    pub grad_norm: f32,
    /// The factor gradclip multiplied the gradients by (1: untouched).
    pub coefficient: f32,
    /// The max norm the step's clip used (gradclip's `ClipReport::max_norm`;
    /// for ZClip and AutoClip the threshold their GPU pass chose); `+inf`:
    /// nothing would have been clipped (no clipping, or ZClip seeing no spike).
    pub threshold: f32,
    /// The smallest norm the step would have clipped: the line to draw next
    /// to the norm. Fixed and AutoClip: the threshold; ZClip: the spike
    /// boundary `μ + z·(σ + eps)` of its EMA (`+inf` during its warm-up).
    pub boundary: f32,
}

impl StepReport {
    /// gradclip scaled the gradients down.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub fn clipped(&self) -> bool {
        self.coefficient < 1.0
    }
}

/// Where a step's `(step, loss)` comes back through.
struct Readback {
    buffer: wgpu::Buffer,
    mapped: Arc<ManualResetEvent>,
    failed: Arc<Mutex<Option<String>>>,
}

pub struct Trainer {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    config: Config,
    dims: Dims,
    uniforms: wgpu::Buffer,
    params: wgpu::Buffer,
    /// gradclip holds its own binding of it; read back only by the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    grads: wgpu::Buffer,
    stats: wgpu::Buffer,
    bind_group: wgpu::BindGroup,
    forward_backward: wgpu::ComputePipeline,
    gradients: wgpu::ComputePipeline,
    sgd_step: wgpu::ComputePipeline,
    grad_set: GradSet,
    adaptive: Adaptive,
    zclip: AdaptiveClip,
    autoclip: AdaptiveClip,
    /// The mode of the step last submitted: an adaptive clip starts afresh
    /// when its mode is switched to.
    mode: Cell<Option<Mode>>,
    /// The fixed max norm of the step last submitted.
    max_norm: Cell<f32>,
    readback: Readback,
    lr: Cell<f32>,
}

fn storage_entry(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only: false },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

impl Trainer {
    pub fn new(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        info: wgpu::AdapterInfo,
        config: Config,
        adaptive: Adaptive,
    ) -> Result<Self, gradclip::Error> {
        let param_count = config.param_count();
        let dims = Dims {
            batch: config.batch,
            seq_len: config.seq_len,
            loss_from: config.loss_from,
            param_count: param_count as u32,
            seed: config.seed,
            lr: config.lr,
            _pad: [0; 2],
        };
        let uniforms = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("train dims"),
            contents: bytemuck::bytes_of(&dims),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        });
        let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("train parameters"),
            contents: bytemuck::cast_slice(&config.initial_params()),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        });
        let grads = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("train gradients (one flat buffer)"),
            size: param_count as u64 * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let acts = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("train activations"),
            size: config.acts_len() as u64 * 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let stats = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("train stats"),
            size: (2 + config.batch as u64) * 4,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let readback = Readback {
            buffer: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("train report readback"),
                size: REPORT_BYTES,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            mapped: Arc::new(ManualResetEvent::new(false)),
            failed: Arc::new(Mutex::new(None)),
        };

        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("train bind group layout"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: wgpu::BufferSize::new(size_of::<Dims>() as u64),
                    },
                    count: None,
                },
                storage_entry(1), // params
                storage_entry(2), // grads
                storage_entry(3), // acts
                storage_entry(4), // stats
            ],
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("train bind group"),
            layout: &layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: uniforms.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: grads.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: acts.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: stats.as_entire_binding(),
                },
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("train pipeline layout"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("train rnn.wgsl"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let constants = [("HID", config.hidden as f64)];
        let pipeline = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&format!("train {entry}")),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: true,
                },
                cache: None,
            })
        };
        let forward_backward = pipeline("forward_backward");
        let gradients = pipeline("gradients");
        let sgd_step = pipeline("sgd_step");

        let clipper = Clipper::new(device, queue)?;
        let grad_set = clipper.bind(&grads, &GradLayout::from_sizes(&config.tensor_sizes())?)?;
        let zclip = AdaptiveClip::new(&grad_set, adaptive.zclip)?;
        let autoclip = AdaptiveClip::new(&grad_set, adaptive.autoclip)?;
        Ok(Self {
            device: device.clone(),
            queue: queue.clone(),
            info,
            config,
            dims,
            uniforms,
            params,
            grads,
            stats,
            bind_group,
            forward_backward,
            gradients,
            sgd_step,
            grad_set,
            adaptive,
            zclip,
            autoclip,
            mode: Cell::new(None),
            max_norm: Cell::new(f32::INFINITY),
            readback,
            lr: Cell::new(config.lr),
        })
    }

    #[cfg_attr(not(any(test, target_arch = "wasm32")), allow(dead_code))]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The adaptive methods' settings.
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub fn adaptive(&self) -> &Adaptive {
        &self.adaptive
    }

    /// Sets the learning rate of the following steps (one small upload).
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub fn set_lr(&self, lr: f32) {
        if lr != self.lr.get() {
            self.lr.set(lr);
            let dims = Dims { lr, ..self.dims };
            self.queue
                .write_buffer(&self.uniforms, 0, bytemuck::bytes_of(&dims));
        }
    }

    /// Back to the initial weights and step 0 (the data stream restarts
    /// too), and the adaptive clips to their empty state.
    pub fn reset(&self) {
        self.zclip.reset();
        self.autoclip.reset();
        self.mode.set(None);
        self.queue.write_buffer(
            &self.params,
            0,
            bytemuck::cast_slice(&self.config.initial_params()),
        );
        self.queue
            .write_buffer(&self.stats, 0, &[0u8; REPORT_BYTES as usize]);
    }

    /// Records the loss and gradients of one step into `encoder` (no update).
    fn record_gradients(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("train forward, backward, gradients"),
            timestamp_writes: None,
        });
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.set_pipeline(&self.forward_backward);
        pass.dispatch_workgroups(self.config.batch, 1, 1);
        pass.set_pipeline(&self.gradients);
        pass.dispatch_workgroups(self.per_param_workgroups(), 1, 1);
    }

    fn per_param_workgroups(&self) -> u32 {
        (self.config.param_count() as u32).div_ceil(PER_PARAM_WG)
    }

    /// Submits one training step: loss and gradients, gradclip's clip in
    /// `mode` (`max_norm` is the fixed mode's; `Mode::None` measures the norm
    /// alone: `error_if_nonfinite` leaves the gradients untouched, so a
    /// diverging run diverges), the SGD update, and the copy of the step's
    /// report. Await [`report`](Self::report) before the next call.
    ///
    /// Switching to ZClip or AutoClip starts that method afresh (ZClip warms
    /// up again): statistics gathered under another mode would be stale.
    pub fn submit_step(&self, mode: Mode, max_norm: f32) -> Result<(), TrainError> {
        if mode == Mode::Fixed && !(max_norm > 0.0 && max_norm.is_finite()) {
            return Err(TrainError::InvalidMaxNorm(max_norm));
        }
        if self.mode.get() != Some(mode) {
            match mode {
                Mode::ZClip => self.zclip.reset(),
                Mode::AutoClip => self.autoclip.reset(),
                Mode::None | Mode::Fixed => {}
            }
        }
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("train step"),
            });
        self.record_gradients(&mut encoder);
        match mode {
            Mode::None => self.grad_set.clip_norm(
                &mut encoder,
                &ClipNorm::new(f32::MAX).error_if_nonfinite(true),
            )?,
            Mode::Fixed => self
                .grad_set
                .clip_norm(&mut encoder, &ClipNorm::new(max_norm))?,
            // The max norm given is replaced on the GPU by the method's threshold.
            Mode::ZClip => self
                .zclip
                .clip(&self.grad_set, &mut encoder, &ClipNorm::new(1.0))?,
            Mode::AutoClip => {
                self.autoclip
                    .clip(&self.grad_set, &mut encoder, &ClipNorm::new(1.0))?
            }
        }
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("train sgd"),
                timestamp_writes: None,
            });
            pass.set_bind_group(0, &self.bind_group, &[]);
            pass.set_pipeline(&self.sgd_step);
            pass.dispatch_workgroups(self.per_param_workgroups(), 1, 1);
        }
        encoder.copy_buffer_to_buffer(&self.stats, 0, &self.readback.buffer, 0, REPORT_BYTES);
        self.readback.mapped.reset();
        let mapped = self.readback.mapped.clone();
        let failed = self.readback.failed.clone();
        encoder.map_buffer_on_submit(&self.readback.buffer, wgpu::MapMode::Read, .., move |r| {
            if let Err(e) = r {
                *failed.lock().unwrap() = Some(e.to_string());
            }
            mapped.set();
        });
        self.queue.submit([encoder.finish()]);
        self.mode.set(Some(mode));
        self.max_norm.set(max_norm);
        Ok(())
    }

    /// The report of the step last submitted: natively it waits for the
    /// device, in the browser for the map callbacks. ZClip's spike boundary
    /// is not in gradclip's report: for it, ZClip's decision is read back too
    /// (a second small copy, submitted after the step).
    pub async fn report(&self) -> Result<StepReport, TrainError> {
        let mode = self.mode.get().unwrap_or(Mode::None);
        let (grad_norm, coefficient, used) = match self.grad_set.read_report().await {
            Ok(r) => (r.total_norm, r.coefficient, r.max_norm),
            // Clipping off and a NaN/inf norm: the gradients went on as they were.
            Err(gradclip::Error::NonFinite { total_norm }) => (total_norm, 1.0, f32::MAX),
            Err(e) => return Err(e.into()),
        };
        // gradclip's "no clipping" max norm.
        let threshold = if used == f32::MAX {
            f32::INFINITY
        } else {
            used
        };
        let boundary = match mode {
            Mode::None => f32::INFINITY,
            Mode::Fixed => self.max_norm.get(),
            Mode::ZClip => self.zclip.read_decision().await?.boundary,
            Mode::AutoClip => threshold,
        };
        self.readback.mapped.wait().await;
        if let Some(e) = self.readback.failed.lock().unwrap().take() {
            return Err(TrainError::Readback(e));
        }
        let (step, loss) = {
            let view = self
                .readback
                .buffer
                .get_mapped_range(..)
                .map_err(|e| TrainError::Readback(e.to_string()))?;
            let words: &[u32] = bytemuck::cast_slice(&view[..]);
            (words[0], f32::from_bits(words[1]))
        };
        self.readback.buffer.unmap();
        Ok(StepReport {
            step,
            mode,
            loss,
            grad_norm,
            coefficient,
            threshold,
            boundary,
        })
    }

    /// One step's loss and gradients, read back (for tests: this allocates).
    #[cfg(test)]
    pub fn gradients_now(&self) -> (f32, Vec<f32>) {
        let n = self.config.param_count();
        let staging = |label, size| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let grads_back = staging("test gradients readback", n as u64 * 4);
        let stats_back = staging("test stats readback", REPORT_BYTES);
        let mut encoder = self.device.create_command_encoder(&Default::default());
        self.record_gradients(&mut encoder);
        encoder.copy_buffer_to_buffer(&self.grads, 0, &grads_back, 0, n as u64 * 4);
        encoder.copy_buffer_to_buffer(&self.stats, 0, &stats_back, 0, REPORT_BYTES);
        self.queue.submit([encoder.finish()]);
        grads_back.map_async(wgpu::MapMode::Read, .., |r| r.unwrap());
        stats_back.map_async(wgpu::MapMode::Read, .., |r| r.unwrap());
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .unwrap();
        let grads = bytemuck::cast_slice(&grads_back.get_mapped_range(..).unwrap()).to_vec();
        let words: Vec<u32> =
            bytemuck::cast_slice(&stats_back.get_mapped_range(..).unwrap()).to_vec();
        (f32::from_bits(words[1]), grads)
    }
}
