//! Adaptive clipping thresholds computed on the GPU, with no host sync:
//! ZClip, AutoClip and AdaGC (see `docs/adaptive.md`).
//!
//! An [`AdaptiveClip`] keeps its method's state (an EMA, a warm-up buffer, a
//! window of past norms) in a GPU buffer of its own. Each step,
//! [`AdaptiveClip::clip`] records three things into the caller's encoder:
//! the set's [`record_norm`](crate::GradSet::record_norm); one
//! single-workgroup dispatch that reads the norm from the set's
//! `ClipState`, updates the state and writes the threshold; and the set's
//! clip with its own partial, whose `max_norm` is copied on the GPU from the
//! threshold. Nothing is read back and nothing is allocated per step.

use std::sync::atomic::{AtomicBool, Ordering};

use bytemuck::{Pod, Zeroable};
use futures_intrusive::channel::shared::oneshot_channel;

use crate::clipper::uniform_entry;
use crate::config::ClipNorm;
use crate::error::{Error, Result};
use crate::gpu_errors::Catch;
use crate::grad_set::GradSet;
use crate::records::{ClipState, TensorStat, STATS_TENSORS_OFFSET};
use crate::shaders;

mod agc;
mod config;

use crate::records::{D_CLIPPED, D_SKIPPED, D_SPIKE, D_WARMUP, METHOD_ADAGC, P_HISTOGRAM};
pub use agc::{Agc, AgcClip, AgcUnits, UnitReport};
pub use config::{AdaGc, AdaptiveMethod, AutoClip, ZClip, ZClipMode, ZClipTo};
use config::{AdaptiveParams, STATE_HEAD_SIZE};

/// WGSL `AdaptiveState` up to its history.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
struct StateHead {
    method: u32,
    capacity: u32,
    steps: u32,
    count: u32,
    head: u32,
    ema_ready: u32,
    mean: f32,
    variance: f32,
    norm: f32,
    threshold: f32,
    boundary: f32,
    decision: u32,
    max_norm: f32,
    recorded: u32,
    _pad: [u32; 2],
}

const _: () = assert!(size_of::<StateHead>() as u64 == STATE_HEAD_SIZE);

/// Where the threshold, as the clip's `max_norm`, sits in the state buffer.
const MAX_NORM_OFFSET: u64 = core::mem::offset_of!(StateHead, max_norm) as u64;

/// What the adaptive pass decided in the latest step it ran.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveDecision {
    /// The total norm the pass read (the step's `record_norm`).
    pub norm: f32,
    /// The norm the gradients were clipped to; `+inf`: no clipping (ZClip
    /// without a cap during warm-up, or no spike; AutoClip with no history).
    pub threshold: f32,
    /// The smallest norm this step would have clipped: what a plot draws
    /// next to the norm (ZClip: `μ + z_thresh · (σ + eps)`, capped).
    pub boundary: f32,
    /// `norm > threshold`: the gradients were scaled down.
    pub clipped: bool,
    /// ZClip: the spike test fired. AutoClip: the norm was above the percentile.
    pub spike: bool,
    /// The norm was NaN or infinite: the state was left as it was.
    pub skipped: bool,
    /// ZClip: still collecting its warm-up norms.
    pub warmup: bool,
    /// Finite steps folded into the state (low 32 bits).
    pub steps: u32,
    /// Steps the adaptive pass has run, skipped ones included (low 32 bits).
    pub recorded: u32,
}

/// One tensor in AdaGC's latest step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorDecision {
    /// The tensor's norm.
    pub norm: f32,
    /// During warm-up the global threshold (compared with the total norm),
    /// then `lambda_rel · γ` (`+inf` for a tensor without `γ` and a
    /// non-finite norm).
    pub threshold: f32,
    /// What the tensor's gradients were multiplied by.
    pub coefficient: f32,
    /// `γ` after the step (`None` before the tensor's first finite step).
    pub gamma: Option<f32>,
}

/// An adaptive clipping method bound to one [`GradSet`]: its state buffer,
/// parameters, pipeline and bind group, all made once in [`new`](Self::new).
///
/// ```
/// # pollster::block_on(async {
/// # use wgpu::util::DeviceExt;
/// # let (device, queue, _) = gradclip::default_device().await?;
/// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
/// #     label: None, contents: bytemuck::cast_slice(&[3.0f32, 4.0]),
/// #     usage: wgpu::BufferUsages::STORAGE });
/// let clipper = gradclip::Clipper::new(&device, &queue)?;
/// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
/// let zclip = gradclip::AdaptiveClip::new(&set, gradclip::ZClip::new().warmup_steps(4))?;
/// let mut encoder = device.create_command_encoder(&Default::default());
/// // The max_norm given here is replaced by ZClip's threshold on the GPU.
/// zclip.clip(&set, &mut encoder, &gradclip::ClipNorm::new(1.0))?;
/// queue.submit([encoder.finish()]);
/// let decision = zclip.read_decision().await?;
/// assert_eq!((decision.norm, decision.warmup, decision.clipped), (5.0, true, false));
/// assert_eq!(set.read_report().await?.coefficient, 1.0);
/// # Ok::<(), gradclip::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct AdaptiveClip {
    method: AdaptiveMethod,
    params: AdaptiveParams,
    capacity: u32,
    /// The set's rebind count when this was made: AdaGC's dispatch size
    /// depends on where the gradients are.
    rebinds: u64,
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The set's stats buffer, which the bind group reads.
    stats: wgpu::Buffer,
    state: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// A state read is between its copy and its unmap.
    reading: AtomicBool,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    _params: wgpu::Buffer,
}

impl AdaptiveClip {
    /// Makes the state (empty: warm-up not started, no history), the
    /// parameters and the pipeline for `method` on `set`. Invalid parameters
    /// are [`Error::InvalidAdaptive`].
    pub fn new(set: &GradSet, method: impl Into<AdaptiveMethod>) -> Result<Self> {
        let method = method.into();
        let inner = set.inner();
        let device = &inner.device;
        let params = method.to_params(
            device.limits().max_storage_buffer_binding_size,
            set.layout().len() as u32,
            set.tensor_workgroups(),
        )?;
        let adagc = matches!(method, AdaptiveMethod::AdaGc(_));
        crate::gpu_errors::check_alive(device)?;
        // WGSL rounds a struct with a runtime array up to its 8-byte alignment.
        let state_size = STATE_HEAD_SIZE + (4 * params.capacity as u64).next_multiple_of(8);
        let catch = Catch::begin(device);
        let params_buffer = crate::gpu_errors::init_buffer(
            device,
            "gradclip adaptive params",
            bytemuck::bytes_of(&params),
            wgpu::BufferUsages::UNIFORM,
        )?;
        let state = crate::gpu_errors::init_buffer(
            device,
            "gradclip adaptive state",
            &empty_state(&params, state_size),
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        )?;
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip adaptive state readback"),
            size: state_size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let storage = |binding, read_only, min| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: wgpu::BufferSize::new(min),
            },
            count: None,
        };
        // AdaGC writes the set's per-tensor factors and scale dispatch; the
        // others only read the norm in ClipState.
        let (stats_entry, stats_binding, module) = if adagc {
            let min = STATS_TENSORS_OFFSET + size_of::<TensorStat>() as u64;
            (
                storage(0, false, min),
                set.stats_buffer().as_entire_buffer_binding(),
                &shaders::ADAPTIVE_ADAGC,
            )
        } else {
            (
                storage(0, true, size_of::<ClipState>() as u64),
                set.coefficient_binding(),
                &shaders::ADAPTIVE,
            )
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("gradclip adaptive bind group layout"),
            entries: &[
                stats_entry,
                storage(1, false, STATE_HEAD_SIZE + 8),
                uniform_entry::<AdaptiveParams>(2),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("gradclip adaptive pipeline layout"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let shader = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(module.name),
            source: wgpu::ShaderSource::Wgsl(module.source().into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("gradclip adaptive step"),
            layout: Some(&pipeline_layout),
            module: &shader,
            entry_point: Some(module.entry_points[0]),
            compilation_options: Default::default(),
            cache: None,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("gradclip adaptive bind group"),
            layout: &layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(stats_binding),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: state.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: params_buffer.as_entire_binding(),
                },
            ],
        });
        catch.end()?;
        Ok(Self {
            method,
            params,
            capacity: params.capacity,
            rebinds: set.rebind_count(),
            device: device.clone(),
            queue: inner.queue.clone(),
            stats: set.stats_buffer().clone(),
            state,
            staging,
            reading: AtomicBool::new(false),
            pipeline,
            bind_group,
            _params: params_buffer,
        })
    }

    /// The method and its parameters.
    pub fn method(&self) -> &AdaptiveMethod {
        &self.method
    }

    /// Records one adaptively clipped step of `set` (the set this clip was
    /// made for) into `encoder`: the norm, the adaptive pass, and the clip
    /// with the threshold the pass wrote. `clip` gives the norm order and the
    /// semantics; its `max_norm` is replaced on the GPU by the threshold
    /// (`f32::MAX` where the threshold is `+inf`, so nothing is clipped).
    ///
    /// The set records one norm step in two halves: the norm (a
    /// `record_norm` that applies nothing), then the clip with the
    /// threshold, which finishes the same step: one report per step, with
    /// the threshold used (`ClipReport::max_norm`) and the coefficient
    /// applied. The rest of the decision is read with
    /// [`read_decision`](Self::read_decision).
    ///
    /// An unscaling `clip` ([`ClipNorm::unscale`](crate::ClipNorm::unscale))
    /// feeds the method the unscaled norms and updates the loss scale once
    /// per step (ZClip and AutoClip in the second half, AdaGC in its
    /// `record_norm`); AdaGC's factors then divide by the loss scale, so one
    /// multiply unscales and clips each tensor. A step whose gradients
    /// overflowed (`found_inf`) leaves them and the method's state
    /// untouched, as a non-finite norm does.
    ///
    /// AdaGC instead records the set's `record_norm` with per-tensor norms,
    /// its pass, which writes each tensor's factor and the scale dispatch
    /// into the set's stats, and the set's scale pass: the set's report is
    /// the `record_norm`'s (norms right, coefficient not the one applied);
    /// the factors applied are read with
    /// [`read_tensor_decisions`](Self::read_tensor_decisions).
    ///
    /// Rejected ([`Error::Unsupported`]): per-tensor clipping or norms in
    /// `clip` (ZClip and AutoClip clip the total norm; AdaGC asks for the
    /// norms itself), for AdaGC a `clip` of other
    /// semantics than the method's or a set rebound since this was made.
    pub fn clip(
        &self,
        set: &GradSet,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
    ) -> Result<()> {
        self.record(set, encoder, clip, true)
    }

    /// [`clip`](Self::clip) for a fused optimizer (ZClip and AutoClip): the
    /// same step (norm, adaptive pass, threshold, report, loss-scale update)
    /// with the gradients left alone, as [`GradSet::record_norm`] does; the
    /// coefficient the clip would have applied is in the set's
    /// [`coefficient_binding`](GradSet::coefficient_binding) for the
    /// optimizer to multiply by on load (with an unscaling `clip`, the
    /// coefficient divided by the loss scale, and `found_inf` set on an
    /// overflowed step). AdaGC's factors are per tensor, which one
    /// coefficient cannot carry: [`Error::Unsupported`].
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[3.0f32, 4.0]),
    /// #     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
    /// let autoclip = gradclip::AdaptiveClip::new(&set, gradclip::AutoClip::new(10.0))?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// autoclip.record_norm(&set, &mut encoder, &gradclip::ClipNorm::new(1.0))?;
    /// // ... the optimizer's pass, binding set.coefficient_binding() ...
    /// queue.submit([encoder.finish()]);
    /// let report = set.read_report().await?;
    /// // The first norm is its own 10th percentile: the threshold; PyTorch's
    /// // coefficient max_norm / (norm + 1e-6) is a hair below 1.
    /// assert_eq!((report.total_norm, report.max_norm), (5.0, 5.0));
    /// assert!(report.coefficient < 1.0 && report.coefficient > 0.999_999);
    /// // The gradients are as they were: the optimizer applies the coefficient.
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn record_norm(
        &self,
        set: &GradSet,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
    ) -> Result<()> {
        if let AdaptiveMethod::AdaGc(_) = self.method {
            return Err(Error::Unsupported(
                "AdaGC with a fused optimizer: its factors are per tensor",
            ));
        }
        self.record(set, encoder, clip, false)
    }

    fn record(
        &self,
        set: &GradSet,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        scale: bool,
    ) -> Result<()> {
        if set.stats_buffer() != &self.stats {
            return Err(Error::Unsupported(
                "an adaptive clip records only on the set it was made for",
            ));
        }
        if clip.reports_tensor_norms() {
            return Err(Error::Unsupported(
                "per-tensor clipping or norms with an adaptive threshold",
            ));
        }
        if let AdaptiveMethod::AdaGc(a) = self.method {
            if clip.semantics() != a.semantics {
                return Err(Error::Unsupported(
                    "a clip whose semantics differ from the AdaGC's",
                ));
            }
            if set.rebind_count() != self.rebinds {
                return Err(Error::Unsupported(
                    "AdaGC on a set rebound since the AdaptiveClip was made",
                ));
            }
            set.prepare_scale()?;
            set.record_norm_for_tensor_scale(encoder, clip)?;
            self.encode_pass(encoder);
            return set.scale_from_stats(encoder);
        }
        set.prepare_own_partial(clip, scale)?;
        let step = set.record_norm_for_adaptive(encoder, clip)?;
        self.encode_pass(encoder);
        set.clip_own_partial_with_max_norm_from(
            encoder,
            clip,
            (&self.state, MAX_NORM_OFFSET),
            step,
            scale,
        )
    }

    fn encode_pass(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("gradclip adaptive step"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }

    /// The state buffer (`COPY_SRC`): the method's statistics and the
    /// latest decision in 64 bytes, then the warm-up norms (ZClip) or the
    /// window (AutoClip) as f32, or AutoClip's bucket counts over all of
    /// history as u32.
    pub fn state_buffer(&self) -> &wgpu::Buffer {
        &self.state
    }

    /// Bytes of the state, as [`save_state`](Self::save_state) returns them.
    pub fn state_size(&self) -> u64 {
        self.state.size()
    }

    /// Reads the latest step's decision back. Waits for everything
    /// submitted so far (natively it blocks the calling thread until then).
    pub async fn read_decision(&self) -> Result<AdaptiveDecision> {
        let bytes = self.save_state().await?;
        let h: StateHead = bytemuck::pod_read_unaligned(&bytes[..STATE_HEAD_SIZE as usize]);
        Ok(AdaptiveDecision {
            norm: h.norm,
            threshold: h.threshold,
            boundary: h.boundary,
            clipped: h.decision & D_CLIPPED != 0,
            spike: h.decision & D_SPIKE != 0,
            skipped: h.decision & D_SKIPPED != 0,
            warmup: h.decision & D_WARMUP != 0,
            steps: h.steps,
            recorded: h.recorded,
        })
    }

    /// The whole state as bytes, for a checkpoint: copied after everything
    /// submitted so far and read back (natively this blocks the calling
    /// thread until the GPU is there; in the browser it awaits the map).
    pub async fn save_state(&self) -> Result<Vec<u8>> {
        if self.reading.swap(true, Ordering::AcqRel) {
            return Err(Error::Readback(
                "another read of this adaptive state is in flight".into(),
            ));
        }
        let result = self.read_state().await;
        self.reading.store(false, Ordering::Release);
        result
    }

    async fn read_state(&self) -> Result<Vec<u8>> {
        read_back(&self.device, &self.queue, &self.state, &self.staging).await
    }

    /// Replaces the state with `bytes` from [`save_state`](Self::save_state)
    /// of an adaptive clip of the same method and size (a
    /// `queue.write_buffer`: it lands before the next submission). Bytes of
    /// the wrong size or method, or that no run of the method can produce,
    /// are [`Error::InvalidAdaptiveState`] and change nothing.
    pub fn restore_state(&self, bytes: &[u8]) -> Result<()> {
        self.check_saved(bytes)?;
        self.queue.write_buffer(&self.state, 0, bytes);
        Ok(())
    }

    /// Whether `bytes` are a state of this clip's method and size that a
    /// run of the method can produce ([`Error::InvalidAdaptiveState`] if not).
    fn check_saved(&self, bytes: &[u8]) -> Result<()> {
        let bad = |what| Err(Error::InvalidAdaptiveState(what));
        if bytes.len() as u64 != self.state.size() {
            return bad("not the size of this adaptive clip's state");
        }
        let h: StateHead = bytemuck::pod_read_unaligned(&bytes[..STATE_HEAD_SIZE as usize]);
        if h.method != self.params.method || h.capacity != self.capacity {
            return bad("saved by another method or with another size");
        }
        let words = bytes[STATE_HEAD_SIZE as usize..]
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        if self.params.flags & P_HISTOGRAM != 0 {
            // AutoClip over all of history: bucket counts adding up to count.
            let total: u64 = words.map(u64::from).sum();
            if h.head != 0 || total != h.count as u64 {
                return bad("AutoClip's bucket counts do not add up to its count");
            }
            return Ok(());
        }
        let history: Vec<f32> = words.map(f32::from_bits).collect();
        if h.head >= self.capacity.max(1) || h.count > self.capacity {
            return bad("history position out of range");
        }
        let valid = |x: f32| x.is_finite() && x >= 0.0;
        if let AdaptiveMethod::AdaGc(_) = self.method {
            // γ, or -1 before the tensor's first finite step.
            let mut gammas = history.chunks_exact(4).map(|t| t[0]);
            if gammas.any(|g| !(valid(g) || g == -1.0)) {
                return bad("an AdaGC γ that is non-finite or negative");
            }
        } else if history[..h.count as usize].iter().any(|&x| !valid(x)) {
            return bad("a stored norm that is negative or non-finite");
        }
        if let AdaptiveMethod::ZClip(_) = self.method {
            let ready = match h.ema_ready {
                0 => false,
                1 => true,
                _ => return bad("ZClip's EMA flag is neither 0 nor 1"),
            };
            if h.count >= self.capacity || (ready && h.count != 0) {
                return bad("ZClip's warm-up count out of range");
            }
            if ready && !(valid(h.mean) && valid(h.variance)) {
                return bad("ZClip's EMA is negative or non-finite");
            }
        }
        Ok(())
    }

    /// Back to the empty state (warm-up not started, no history), from the
    /// next submission on.
    pub fn reset(&self) {
        self.queue.write_buffer(
            &self.state,
            0,
            &empty_state(&self.params, self.state.size()),
        );
    }

    /// AdaGC: each tensor's norm, threshold, factor and `γ` in the latest
    /// step (waits like [`read_decision`](Self::read_decision)). Empty for
    /// the other methods.
    pub async fn read_tensor_decisions(&self) -> Result<Vec<TensorDecision>> {
        if !matches!(self.method, AdaptiveMethod::AdaGc(_)) {
            return Ok(Vec::new());
        }
        let bytes = self.save_state().await?;
        let words: Vec<f32> = bytes[STATE_HEAD_SIZE as usize..]
            .chunks_exact(4)
            .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        Ok(words
            .chunks_exact(4)
            .take(self.params.tensors as usize)
            .map(|t| TensorDecision {
                gamma: (t[0] >= 0.0).then_some(t[0]),
                norm: t[1],
                threshold: t[2],
                coefficient: t[3],
            })
            .collect())
    }
}

/// The state of a method that has seen nothing yet.
fn empty_state(params: &AdaptiveParams, size: u64) -> Vec<u8> {
    let head = StateHead {
        method: params.method,
        capacity: params.capacity,
        threshold: f32::INFINITY,
        boundary: f32::INFINITY,
        max_norm: f32::MAX,
        ..Default::default()
    };
    let mut bytes = vec![0u8; size as usize];
    bytes[..STATE_HEAD_SIZE as usize].copy_from_slice(bytemuck::bytes_of(&head));
    if params.method == METHOD_ADAGC {
        // No γ yet.
        let first = STATE_HEAD_SIZE as usize;
        for t in 0..params.tensors as usize {
            bytes[first + 16 * t..first + 16 * t + 4].copy_from_slice(&(-1.0f32).to_le_bytes());
        }
    }
    bytes
}

/// Copies `source` into `staging` (a `MAP_READ` buffer of the same size),
/// submits, and returns the bytes once mapped. Natively it blocks until the
/// GPU is there; in the browser it awaits the map.
async fn read_back(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    source: &wgpu::Buffer,
    staging: &wgpu::Buffer,
) -> Result<Vec<u8>> {
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("gradclip adaptive read"),
    });
    encoder.copy_buffer_to_buffer(source, 0, staging, 0, source.size());
    let (sender, receiver) = oneshot_channel();
    encoder.map_buffer_on_submit(staging, wgpu::MapMode::Read, .., move |result| {
        let _ = sender.send(result);
    });
    let _submission = queue.submit([encoder.finish()]);
    #[cfg(not(target_arch = "wasm32"))]
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(_submission),
            timeout: None,
        })
        .map_err(|e| Error::Readback(e.to_string()))?;
    // The callback may run on another thread's poll: wait for it, not for the poll.
    match receiver.receive().await {
        Some(Ok(())) => {}
        Some(Err(e)) => return Err(Error::Readback(e.to_string())),
        None => return Err(Error::Readback("the map callback was dropped".into())),
    }
    let bytes = staging
        .get_mapped_range(..)
        .map_err(|e| Error::Readback(e.to_string()))?
        .to_vec();
    staging.unmap();
    Ok(bytes)
}
