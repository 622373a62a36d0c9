//! Global-norm gradient clipping for [burn](https://burn.dev) on its wgpu
//! backend, by [gradclip](gradclip): the gradients of a burn model are
//! clipped in place, on the GPU, on the very `wgpu::Device` and
//! `wgpu::Queue` burn runs on, with no host round trip.
//!
//! ```no_run
//! # use burn::prelude::*;
//! # use burn::optim::{GradientsParams, Optimizer, SgdConfig};
//! # #[derive(Module, Debug)] struct Model { l: burn::nn::Linear }
//! # fn loss(m: &Model) -> Tensor<1> { todo!() }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (device, setup) = Device::wgpu_options().init_with_setup()?;   // burn's device and its wgpu handles
//! let device = device.autodiff();
//! let mut clipper = gradclip_burn::GradClipper::new(&setup, gradclip_burn::ClipNorm::new(1.0))?;
//! # let mut model = Model { l: burn::nn::LinearConfig::new(2, 2).init(&device) };
//! let mut optimizer = SgdConfig::new().init();
//! // each step:
//! let grads = GradientsParams::from_grads(loss(&model).backward(), &model);
//! let grads = clipper.clip(&model, grads)?;                           // recorded and submitted, never waits
//! model = optimizer.step(0.1, model, grads);
//! for report in clipper.poll_reports()?.reports {                     // a step or two later, never waits
//!     println!("step {}: norm {} x{}", report.step, report.total_norm, report.coefficient);
//! }
//! # Ok(()) }
//! ```
//!
//! # Ordering
//!
//! burn queues work lazily twice over: fusion records operations and runs
//! them when a result is needed, and cubecl batches the kernels it launches
//! into a command encoder that it submits every few dozen tasks. `clip`
//! resolves each gradient (fusion runs everything up to it), takes its
//! storage from cubecl, flushes cubecl's streams (their encoders are
//! submitted), and only then submits gradclip's commands to the same queue.
//! A queue runs submissions in order, so the clip sees what the backward pass
//! wrote, and the optimizer's kernels, submitted later, see the clipped
//! values. Nothing waits on the host.
//!
//! # Steady state
//!
//! The bound [`gradclip::GradSet`] (chunk table, scratch, bind groups) is
//! kept while the gradients' places (buffer, offset, size, type) are
//! unchanged, which is what cubecl's memory pool hands back step after step.
//! When they change, [`GradSet::rebind_ranges`](gradclip::GradSet::rebind_ranges)
//! rebuilds only what depends on them; [`GradClipper::rebinds`] counts it.

mod device;
mod error;
mod params;
mod storage;

use burn::backend::wgpu::WgpuSetup;
use burn::module::{Module, ParamId};
use burn::optim::GradientsParams;
pub use device::init_from_env;
pub use error::{Error, Result};
pub use gradclip::{ClipNorm, ClipReport, GradType, Norm, Reports, Semantics};

use params::ParamInfo;
use storage::Taken;

/// What each clip does.
#[derive(Clone, Debug, PartialEq)]
pub enum Clip {
    /// Clip by a norm: global by default, per tensor with `ClipNorm::per_tensor`.
    Norm(ClipNorm),
    /// Clamp every element into `[min, max]` (PyTorch's `clip_grad_value_(v)` is `-v, v`).
    Value { min: f32, max: f32 },
}

/// The gradients a set is bound to: which parameters, in which order, how
/// many elements of which type.
type Key = Vec<(ParamId, usize, GradType)>;

struct Bound {
    set: gradclip::GradSet,
    key: Key,
    names: Vec<String>,
}

/// Clips the gradients of a burn model on burn's wgpu device.
///
/// Made once from the [`WgpuSetup`] burn runs on; then
/// [`clip`](Self::clip) every step between `backward` and the optimizer.
pub struct GradClipper {
    clipper: gradclip::Clipper,
    device: wgpu::Device,
    queue: wgpu::Queue,
    clip: Clip,
    bound: Option<Bound>,
    /// Reports of sets replaced by a bind, not yet collected.
    carried: Reports,
    binds: u64,
    /// Rebinds of sets that were since replaced.
    past_rebinds: u64,
    copies: u64,
}

impl GradClipper {
    /// A clipper for norm clipping on the device and queue of `setup`, the
    /// handles burn's wgpu runtime runs on (from
    /// `Device::wgpu_options().init_with_setup()`, or the setup you
    /// registered with `Device::wgpu_options().setup(..)`).
    pub fn new(setup: &WgpuSetup, clip: ClipNorm) -> Result<Self> {
        Self::with_clip(setup, Clip::Norm(clip))
    }

    /// A clipper for any [`Clip`].
    pub fn with_clip(setup: &WgpuSetup, clip: Clip) -> Result<Self> {
        check(&clip)?;
        Ok(Self {
            clipper: gradclip::Clipper::new(&setup.device, &setup.queue)?,
            device: setup.device.clone(),
            queue: setup.queue.clone(),
            clip,
            bound: None,
            carried: Reports::default(),
            binds: 0,
            past_rebinds: 0,
            copies: 0,
        })
    }

    /// Changes what later clips do (a max-norm schedule, say). Nothing is rebound.
    pub fn set_clip(&mut self, clip: Clip) -> Result<()> {
        check(&clip)?;
        self.clip = clip;
        Ok(())
    }

    /// What each clip does.
    pub fn clip_config(&self) -> &Clip {
        &self.clip
    }

    /// Clips `grads`, the gradients of `model`'s float parameters, in place
    /// on the GPU, and returns them. The clip is recorded and submitted to
    /// burn's queue after burn's pending work; nothing is read back and
    /// nothing waits. On an error nothing was recorded, and the gradients
    /// are dropped (use [`clip_in_place`](Self::clip_in_place) to keep them).
    pub fn clip<M: Module>(
        &mut self,
        model: &M,
        mut grads: GradientsParams,
    ) -> Result<GradientsParams> {
        self.clip_in_place(model, &mut grads)?;
        Ok(grads)
    }

    /// [`clip`](Self::clip) on borrowed gradients: on an error they are left
    /// as they were.
    pub fn clip_in_place<M: Module>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<()> {
        let params = params::collect(model);
        let mut taken: Vec<Taken> = Vec::new();
        let mut result = self.take_all(&params, grads, &mut taken);
        if result.is_ok() {
            result = self.clip_taken(&params, &mut taken);
        }
        for t in taken {
            let info = &params[t.param];
            storage::give_back(grads, info, t);
        }
        result
    }

    fn take_all(
        &mut self,
        params: &[ParamInfo],
        grads: &mut GradientsParams,
        taken: &mut Vec<Taken>,
    ) -> Result<()> {
        for (index, info) in params.iter().enumerate() {
            // An empty tensor has nothing to clip, and an empty range cannot be bound.
            if info.elements == 0 {
                continue;
            }
            if let Some(t) = storage::take(grads, info, index)? {
                taken.push(t);
            }
        }
        Ok(())
    }

    fn clip_taken(&mut self, params: &[ParamInfo], taken: &mut [Taken]) -> Result<()> {
        if taken.is_empty() {
            return Ok(());
        }
        // gradclip scales ranges in place: each gradient must own a dense range.
        for t in taken.iter_mut() {
            if !t.cube.is_contiguous() {
                storage::own_copy(t);
                self.copies += 1;
            }
        }
        let mut resources = taken
            .iter()
            .map(|t| storage::resource(t, &params[t.param].path))
            .collect::<Result<Vec<_>>>()?;
        for i in shared_storage(taken, &resources, params) {
            storage::own_copy(&mut taken[i]);
            resources[i] = storage::resource(&taken[i], &params[taken[i].param].path)?;
            self.copies += 1;
        }
        storage::flush(taken)?;

        let ranges: Vec<(wgpu::BufferBinding<'_>, GradType)> = taken
            .iter()
            .zip(&resources)
            .map(|(t, r)| {
                let r = &r.resource;
                let bytes = storage::bytes(t, params[t.param].elements);
                (
                    wgpu::BufferBinding {
                        buffer: &r.buffer,
                        offset: r.offset,
                        size: wgpu::BufferSize::new(bytes),
                    },
                    t.dtype,
                )
            })
            .collect();
        let key: Key = taken
            .iter()
            .map(|t| (params[t.param].id, params[t.param].elements, t.dtype))
            .collect();
        match &mut self.bound {
            Some(bound) if bound.key == key => {
                bound.set.rebind_ranges(&ranges)?;
            }
            _ => {
                let names: Vec<String> =
                    taken.iter().map(|t| params[t.param].path.clone()).collect();
                let named: Vec<(&str, usize)> = names
                    .iter()
                    .zip(&key)
                    .map(|(n, k)| (n.as_str(), k.1))
                    .collect();
                let layout = gradclip::GradLayout::from_named(&named)?;
                let set = self.clipper.bind_ranges_as(&layout, &ranges)?;
                if let Some(old) = self.bound.take() {
                    // A rare path (the parameters changed): collect the old
                    // set's last reports before it goes.
                    let mut old_reports = pollster::block_on(old.set.take_reports())?;
                    self.carried.reports.append(&mut old_reports.reports);
                    self.carried.dropped += old_reports.dropped;
                    self.carried.tensor_norms_missed += old_reports.tensor_norms_missed;
                    self.past_rebinds += old.set.rebind_count();
                }
                self.binds += 1;
                self.bound = Some(Bound { set, key, names });
            }
        }
        let set = &self.bound.as_ref().expect("bound above").set;
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("gradclip-burn clip"),
            });
        match &self.clip {
            Clip::Norm(clip) => set.clip_norm(&mut encoder, clip)?,
            Clip::Value { min, max } => set.clip_value(&mut encoder, *min, *max)?,
        }
        self.queue.submit([encoder.finish()]);
        // The storage may move again once the submission holds the buffers.
        drop(ranges);
        drop(resources);
        Ok(())
    }

    /// Collects the reports that are back, without waiting (see
    /// [`GradSet::poll_reports`](gradclip::GradSet::poll_reports)): call it
    /// after each step to log every step's norm a step or two late.
    pub fn poll_reports(&mut self) -> Result<Reports> {
        let mut out = std::mem::take(&mut self.carried);
        if let Some(bound) = &self.bound {
            let mut more = bound.set.poll_reports()?;
            out.reports.append(&mut more.reports);
            out.dropped += more.dropped;
            out.tensor_norms_missed += more.tensor_norms_missed;
        }
        Ok(out)
    }

    /// Every report not yet collected, **waiting** for the GPU to finish the
    /// clips submitted so far.
    pub fn take_reports(&mut self) -> Result<Reports> {
        let mut out = std::mem::take(&mut self.carried);
        if let Some(bound) = &self.bound {
            let mut more = pollster::block_on(bound.set.take_reports())?;
            out.reports.append(&mut more.reports);
            out.dropped += more.dropped;
            out.tensor_norms_missed += more.tensor_norms_missed;
        }
        Ok(out)
    }

    /// The report of the latest clip, **waiting** for it: PyTorch's
    /// `error_if_nonfinite` raise, for a loop that wants to skip the
    /// optimizer step on it (the gradients were left untouched), is
    /// `clipper.read_report()?` before `optimizer.step`.
    pub fn read_report(&self) -> Result<ClipReport> {
        let bound = self.bound.as_ref().ok_or(Error::NoClip)?;
        Ok(pollster::block_on(bound.set.read_report())?)
    }

    /// The parameter paths of the bound gradients, in the order of
    /// `ClipReport::tensor_norms`.
    pub fn tensor_names(&self) -> &[String] {
        self.bound.as_ref().map_or(&[], |b| &b.names)
    }

    /// `(parameter path, norm)` of each gradient in a report of a clip made
    /// with `ClipNorm::tensor_norms(true)` (empty otherwise).
    pub fn named_norms<'a>(&'a self, report: &'a ClipReport) -> Vec<(&'a str, f32)> {
        self.tensor_names()
            .iter()
            .map(String::as_str)
            .zip(report.tensor_norms.iter().copied())
            .collect()
    }

    /// How many times the gradients were bound from scratch (the set of
    /// parameters with gradients changed; 1 in a plain training loop).
    pub fn binds(&self) -> u64 {
        self.binds
    }

    /// How many clips found the gradients at new places and rebound the set
    /// (new chunk table and bind groups, no new scratch or readback buffers).
    pub fn rebinds(&self) -> u64 {
        self.past_rebinds + self.bound.as_ref().map_or(0, |b| b.set.rebind_count())
    }

    /// Of the current set's rebinds, those that built a new plan table and
    /// bind groups; the others went back to the places before the latest
    /// rebind, which the set keeps bound
    /// ([`GradSet::rebuild_count`](gradclip::GradSet::rebuild_count)).
    pub fn rebuilds(&self) -> u64 {
        self.bound.as_ref().map_or(0, |b| b.set.rebuild_count())
    }

    /// Gradients copied to storage of their own before a clip: strided
    /// views, or gradients sharing storage with another (burn hands both out
    /// for some graphs).
    pub fn copies(&self) -> u64 {
        self.copies
    }

    /// The bound gradient set, once a clip has bound one: for
    /// `coefficient_binding` (a fused optimizer) or `read_partial` (sharding).
    pub fn grad_set(&self) -> Option<&gradclip::GradSet> {
        self.bound.as_ref().map(|b| &b.set)
    }
}

fn check(clip: &Clip) -> Result<()> {
    match *clip {
        Clip::Norm(ref c) => {
            let m = c.max_norm();
            let tf = c.semantics() == Semantics::TensorFlow;
            if !m.is_finite() || m < 0.0 || (tf && m == 0.0) {
                return Err(gradclip::Error::InvalidMaxNorm(m).into());
            }
            if let Norm::P(p) = c.norm_order() {
                if p.is_nan() || p < Norm::MIN_P {
                    return Err(gradclip::Error::InvalidNormOrder(p).into());
                }
            }
        }
        Clip::Value { min, max } => {
            if min.is_nan() || max.is_nan() || min > max {
                return Err(gradclip::Error::InvalidClampRange { min, max }.into());
            }
        }
    }
    Ok(())
}

/// Indices of gradients whose bytes overlap an earlier gradient's: burn
/// may hand out one tensor as the gradient of two parameters.
fn shared_storage(
    taken: &[Taken],
    resources: &[storage::Held],
    params: &[ParamInfo],
) -> Vec<usize> {
    let mut spans: Vec<(&wgpu::Buffer, u64, u64, usize)> = taken
        .iter()
        .zip(resources)
        .enumerate()
        .map(|(i, (t, r))| {
            let r = &r.resource;
            let end = r.offset + storage::bytes(t, params[t.param].elements);
            (&r.buffer, r.offset, end, i)
        })
        .collect();
    spans.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let mut out = Vec::new();
    let mut reach: Option<(&wgpu::Buffer, u64)> = None;
    for &(buffer, start, end, i) in &spans {
        match reach {
            Some((b, r)) if b == buffer && start < r => {
                out.push(i);
                reach = Some((b, r.max(end)));
            }
            _ => reach = Some((buffer, end)),
        }
    }
    out
}
