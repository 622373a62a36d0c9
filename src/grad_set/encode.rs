//! Recording one step into the caller's encoder: the checks, the clip's
//! parameters (carried by its own commands), the passes.

use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::GradSet;
use crate::clipper::ReduceNeeds;
use crate::config::{clamp_record, ClipNorm, Reduction};
use crate::error::{Error, Result};
use crate::gpu_errors::check_same_device;
use crate::lock::lock;
use crate::partial::NormPartial;
use crate::plan::{check_recordable, require_usage, too_large};
use crate::records::{
    ClipConfig, Partial, CFG_KEEP_SCALE, CFG_NO_SCALE, CFG_PER_TENSOR, CFG_SUPPLIED,
    CFG_TENSOR_NORMS, CONFIG_SUPPLIED_OFFSET, DISPATCH_OFFSET, DISPATCH_SIZE, STATS_PARTIAL_OFFSET,
};

/// Byte offset of `max_norm` inside `ClipConfig`.
const CONFIG_MAX_NORM_OFFSET: u64 = core::mem::offset_of!(ClipConfig, max_norm) as u64;

/// Where `clip_norm_timed` writes its timestamps: a query set and the first index.
type Timing<'a> = Option<(&'a wgpu::QuerySet, u32)>;

/// Timestamps at the beginning and end of a pass, `begin` and `end` past the first index.
fn timestamp_writes(
    timing: Timing<'_>,
    begin: u32,
    end: u32,
) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
    timing.map(|(query_set, first)| wgpu::ComputePassTimestampWrites {
        query_set,
        beginning_of_pass_write_index: Some(first + begin),
        end_of_pass_write_index: Some(first + end),
    })
}

/// Objects found to belong to the clipper's device, by a hash of their
/// identity, so that a source buffer or query set used every step is probed
/// once (a probe records and finishes a throwaway encoder).
#[derive(Debug, Default)]
pub(super) struct Verified(Mutex<Vec<u64>>);

impl Verified {
    fn check(
        &self,
        device: &wgpu::Device,
        object: &impl Hash,
        what: &'static str,
        record: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        object.hash(&mut hasher);
        let key = hasher.finish();
        let mut known = lock(&self.0);
        if known.contains(&key) {
            return Ok(());
        }
        check_same_device(device, what, record)?;
        if known.len() >= 8 {
            known.remove(0);
        }
        known.push(key);
        Ok(())
    }
}

impl GradSet {
    /// Records a norm clip into `encoder`: the clip's parameters, the reduce
    /// pass, the finalize dispatch and the in-place scale pass, whose
    /// workgroup count finalize sets on the GPU (zero when every factor is
    /// exactly 1). Global by default, per tensor with
    /// [`ClipNorm::per_tensor`]. Nothing is read back, and the clip's report
    /// stays on the GPU until a read asks for it.
    ///
    /// Clips carry their parameters in their own commands: any number of
    /// clips with different parameters may be recorded into one encoder, or
    /// into several encoders submitted in any order, and each sees its own.
    ///
    /// Errors, returned before anything is recorded: invalid parameters, a
    /// gradient buffer that is mapped or destroyed, a lost device. Not
    /// detectable here, and reported by wgpu when the encoder is finished or
    /// submitted: an encoder of another device, a gradient buffer mapped or
    /// destroyed after this call and before the submission (the submission
    /// is then rejected and the step makes no report).
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[3.0f32, 4.0, 0.0, 12.0]),
    /// #     usage: wgpu::BufferUsages::STORAGE });
    /// let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let layout = gradclip::GradLayout::from_named(&[("w", 2), ("b", 2)])?;
    /// let set = clipper.bind(&grads, &layout)?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.clip_norm(&mut encoder, &gradclip::ClipNorm::new(1.0).tensor_norms(true))?;
    /// queue.submit([encoder.finish()]);
    /// let report = set.read_report().await?;
    /// assert_eq!(report.total_norm, 13.0);
    /// assert_eq!(report.tensor_norms, [5.0, 12.0]);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn clip_norm(&self, encoder: &mut wgpu::CommandEncoder, clip: &ClipNorm) -> Result<()> {
        let (reduction, config) = clip.to_record()?;
        self.prepare_norm(reduction, &config)?;
        self.prepare_scale()?;
        self.begin(encoder, config, true)?;
        self.encode_norm(encoder, reduction, &config, None)?;
        self.encode_scale(encoder, None)
    }

    /// Timestamp queries written by one [`clip_norm_timed`](Self::clip_norm_timed).
    pub const CLIP_TIMESTAMPS: u32 = 5;

    /// [`clip_norm`](Self::clip_norm) plus GPU timestamps, for benchmarks and
    /// profilers; the recorded work is otherwise identical. Writes
    /// `query_set[first_index + k]` for k = 0: the reduce pass begins;
    /// 1: reduce is done, finalize begins (only on devices with
    /// `Features::TIMESTAMP_QUERY_INSIDE_PASSES`); 2: finalize is done;
    /// 3 and 4: the scale pass begins and ends (not written for a layout
    /// without elements). Between 2 and 3 nothing is recorded.
    ///
    /// Needs `Features::TIMESTAMP_QUERY` and a `QueryType::Timestamp` set of
    /// the clipper's device with room for
    /// [`CLIP_TIMESTAMPS`](Self::CLIP_TIMESTAMPS) queries from `first_index`.
    pub fn clip_norm_timed(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        query_set: &wgpu::QuerySet,
        first_index: u32,
    ) -> Result<()> {
        let device = &self.inner.device;
        if !device.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            return Err(Error::UnsupportedDevice {
                what: "timestamp queries",
                have: 0,
                need: 1,
            });
        }
        if !matches!(query_set.ty(), wgpu::QueryType::Timestamp) {
            return Err(Error::NotTimestampQuerySet);
        }
        too_large(
            "timestamp query index",
            first_index as u64 + Self::CLIP_TIMESTAMPS as u64,
            query_set.count() as u64,
        )?;
        self.verified
            .check(device, query_set, "query set", |encoder| {
                // Resolving needs no written query and touches nothing else.
                let probe = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("gradclip query probe"),
                    size: 8,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE,
                    mapped_at_creation: false,
                });
                encoder.resolve_query_set(query_set, 0..1, &probe, 0);
            })?;
        let (reduction, config) = clip.to_record()?;
        self.prepare_norm(reduction, &config)?;
        self.prepare_scale()?;
        self.begin(encoder, config, true)?;
        let timing = Some((query_set, first_index));
        self.encode_norm(encoder, reduction, &config, timing)?;
        self.encode_scale(encoder, timing)
    }

    /// Records the norm, the clip factor and this set's
    /// [`NormPartial`](crate::NormPartial) without touching the gradients
    /// (PyTorch's `get_total_norm`): for an optimizer that applies
    /// [`coefficient_binding`](Self::coefficient_binding) on load, or for a
    /// shard whose partial is combined with other ranks' before
    /// [`clip_with_partial`](Self::clip_with_partial).
    ///
    /// Per-tensor clipping is rejected ([`Error::Unsupported`]): an
    /// optimizer reading the one factor of `coefficient_binding` could not
    /// apply per-tensor factors. Per-tensor norms for logging are fine.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[3.0f32, 4.0]),
    /// #     usage: wgpu::BufferUsages::STORAGE });
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.record_norm(&mut encoder, &gradclip::ClipNorm::new(1.0))?;
    /// queue.submit([encoder.finish()]);
    /// let report = set.read_report().await?;
    /// assert_eq!((report.total_norm, report.coefficient), (5.0, 1.0 / (5.0 + 1e-6)));
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn record_norm(&self, encoder: &mut wgpu::CommandEncoder, clip: &ClipNorm) -> Result<()> {
        if clip.is_per_tensor() {
            return Err(Error::Unsupported(
                "per-tensor clipping in record_norm: an optimizer applies one factor",
            ));
        }
        self.record_norm_with(encoder, clip, 0)?;
        Ok(())
    }

    /// [`record_norm`](Self::record_norm) with `flags` added to the
    /// config's; returns the step number it took.
    fn record_norm_with(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        flags: u32,
    ) -> Result<u64> {
        let (reduction, mut config) = clip.to_record()?;
        config.flags |= CFG_NO_SCALE | flags;
        self.prepare_norm(reduction, &config)?;
        let step = self.begin(encoder, config, true)?;
        self.encode_norm(encoder, reduction, &config, None)?;
        Ok(step)
    }

    /// Clips with a total that the caller supplies (PyTorch's
    /// `clip_grads_with_norm_`): `partial`, typically all ranks' partials
    /// [combined](crate::NormPartial::combine), is recorded into the encoder
    /// with the clip; the factor is computed from it on the GPU and the
    /// gradients are scaled, not reduced again. The report's norm and
    /// partial are the supplied ones.
    ///
    /// Per-tensor clipping and per-tensor norms have no supplied total:
    /// they are rejected ([`Error::Unsupported`]). A partial that no
    /// reduction of the clip's norm can produce is [`Error::InvalidPartial`].
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let shard = |data: &[f32]| device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: Some("shard"), contents: bytemuck::cast_slice(data), usage: wgpu::BufferUsages::STORAGE });
    /// let (a, b) = (shard(&[3.0, 0.0]), shard(&[4.0]));
    /// let sets = [clipper.bind(&a, &gradclip::GradLayout::from_sizes(&[2])?)?,
    ///             clipper.bind(&b, &gradclip::GradLayout::from_sizes(&[1])?)?];
    /// let clip = gradclip::ClipNorm::new(1.0);
    /// // Each rank: its partial.
    /// let mut partials = Vec::new();
    /// for set in &sets {
    ///     let mut encoder = device.create_command_encoder(&Default::default());
    ///     set.record_norm(&mut encoder, &clip)?;
    ///     queue.submit([encoder.finish()]);
    ///     partials.push(set.read_partial().await?.1);
    /// }
    /// // The all-reduce, then every rank clips with the combined norm.
    /// let combined = gradclip::NormPartial::combine(&partials, gradclip::Norm::L2)?;
    /// for set in &sets {
    ///     let mut encoder = device.create_command_encoder(&Default::default());
    ///     set.clip_with_partial(&mut encoder, &clip, &combined)?;
    ///     queue.submit([encoder.finish()]);
    ///     assert_eq!(set.read_report().await?.total_norm, 5.0);
    /// }
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn clip_with_partial(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        partial: &NormPartial,
    ) -> Result<()> {
        let (reduction, mut config) = supplied_config(clip)?;
        partial.check(clip.norm_order())?;
        config.supplied = partial.0;
        self.prepare_finish(reduction, true)?;
        self.begin(encoder, config, true)?;
        self.encode_finish(encoder, reduction)?;
        self.encode_scale(encoder, None)
    }

    /// [`clip_with_partial`](Self::clip_with_partial) with the 16-byte
    /// partial read on the GPU from `source` at `offset` (usage `COPY_SRC`,
    /// a 4-byte aligned offset): a partial combined on the GPU, or another
    /// set's [`stats_buffer`](Self::stats_buffer) at its
    /// [`partial_offset`](Self::partial_offset) — this set's own included.
    ///
    /// The bytes are only known on the GPU, so they are checked there with
    /// the rules of [`NormPartial::check`]: bytes that no reduction of the
    /// clip's norm can produce leave the gradients and the loss scale
    /// untouched, and the step's report is [`Error::InvalidPartial`].
    /// A source buffer that is mapped, destroyed or of another device is an
    /// error before anything is recorded (natively; in the browser a foreign
    /// buffer is reported by wgpu when the encoder is finished).
    pub fn clip_with_partial_from(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        source: &wgpu::Buffer,
        offset: u64,
    ) -> Result<()> {
        let (reduction, config) = supplied_config(clip)?;
        require_usage(source, wgpu::BufferUsages::COPY_SRC)?;
        let bytes = size_of::<Partial>() as u64;
        if !offset.is_multiple_of(4)
            || offset
                .checked_add(bytes)
                .is_none_or(|end| end > source.size())
        {
            return Err(Error::LayoutExceedsBuffer {
                needed: offset.saturating_add(bytes),
                buffer_size: source.size(),
            });
        }
        check_recordable(source, "partial's source buffer")?;
        let device = &self.inner.device;
        self.verified
            .check(device, source, "partial's source buffer", |encoder| {
                encoder.copy_buffer_to_buffer(source, offset, &self.indirect, 0, 4);
            })?;
        self.prepare_finish(reduction, true)?;
        self.begin(encoder, config, true)?;
        encoder.copy_buffer_to_buffer(source, offset, &self.config, CONFIG_SUPPLIED_OFFSET, bytes);
        self.encode_finish(encoder, reduction)?;
        self.encode_scale(encoder, None)
    }

    /// The first half of an adaptive method's step ([`crate::adaptive`]):
    /// [`record_norm`](Self::record_norm), unscaled by the loss scale when
    /// `clip` unscales but leaving the scale for the second half to update.
    /// Returns the step number, for
    /// [`clip_own_partial_with_max_norm_from`](Self::clip_own_partial_with_max_norm_from).
    pub(crate) fn record_norm_for_adaptive(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
    ) -> Result<u64> {
        self.record_norm_with(encoder, clip, CFG_KEEP_SCALE)
    }

    /// Compiles what [`clip_own_partial_with_max_norm_from`](Self::clip_own_partial_with_max_norm_from)
    /// records, so that an adaptive step can compile everything before its
    /// first half records anything.
    pub(crate) fn prepare_own_partial(&self, clip: &ClipNorm, scale: bool) -> Result<()> {
        let (reduction, _) = supplied_config(clip)?;
        self.prepare_finish(reduction, scale)
    }

    /// The second half of an adaptive method's step, finishing step `step`
    /// (its report replaces the first half's), recorded into the encoder of
    /// the first half right after it: like
    /// [`clip_with_partial_from`](Self::clip_with_partial_from) with this
    /// set's own partial (left by the first half), and with the clip's
    /// `max_norm` replaced by the 4 bytes at `max_norm_from`, written on
    /// the GPU by the adaptive pass. Both copies are recorded after the
    /// config upload, so they override it.
    ///
    /// With `scale` false the gradients are left alone: the coefficient and
    /// the report only, for an optimizer that applies the coefficient on load.
    pub(crate) fn clip_own_partial_with_max_norm_from(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        (source, offset): (&wgpu::Buffer, u64),
        step: u64,
        scale: bool,
    ) -> Result<()> {
        let (reduction, mut config) = supplied_config(clip)?;
        if !scale {
            config.flags |= CFG_NO_SCALE;
        }
        check_recordable(source, "adaptive state buffer")?;
        self.prepare_finish(reduction, scale)?;
        self.begin_at(encoder, config, step, false)?;
        encoder.copy_buffer_to_buffer(
            &self.stats,
            STATS_PARTIAL_OFFSET,
            &self.config,
            CONFIG_SUPPLIED_OFFSET,
            size_of::<Partial>() as u64,
        );
        encoder.copy_buffer_to_buffer(source, offset, &self.config, CONFIG_MAX_NORM_OFFSET, 4);
        self.encode_finish(encoder, reduction)?;
        if scale {
            self.encode_scale(encoder, None)?;
        }
        Ok(())
    }

    /// The scale pass alone, with the factors and the dispatch already in
    /// the stats (written there by AdaGC's pass, [`crate::adaptive`]) and
    /// the config of the `record_norm` recorded just before.
    pub(crate) fn scale_from_stats(&self, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
        if !self.bound.has_elements {
            return Ok(());
        }
        // AdaGC's pass writes the dispatch into the stats alone (it binds
        // the set's stats, not its indirect arguments).
        encoder.copy_buffer_to_buffer(
            &self.stats,
            DISPATCH_OFFSET,
            &self.indirect,
            0,
            DISPATCH_SIZE,
        );
        self.encode_scale(encoder, None)
    }

    /// Grid-stride workgroups of the per-tensor chunk walk (what finalize
    /// puts in the scale dispatch of a per-tensor clip).
    pub(crate) fn tensor_workgroups(&self) -> u32 {
        self.bound.tensor_workgroups
    }

    /// AdaGC's norm step: [`record_norm`](Self::record_norm) with per-tensor
    /// norms, its config marked per-tensor so that the scale pass recorded
    /// later ([`scale_from_stats`](Self::scale_from_stats)) walks segments
    /// and applies each tensor's factor (a flat chunk can span tensors).
    pub(crate) fn record_norm_for_tensor_scale(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
    ) -> Result<()> {
        self.record_norm_with(encoder, &clip.tensor_norms(true), CFG_PER_TENSOR)?;
        Ok(())
    }

    /// Records value clipping: every element clamped to `[min, max]` in
    /// place (PyTorch's `clip_grad_value_(v)` is `min = -v, max = v`). NaN
    /// stays NaN; ±inf become the bounds. Makes no report.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[0.5f32, -3.0, f32::NAN]),
    /// #     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC });
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[3])?)?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.clip_value(&mut encoder, -1.0, 1.0)?; // clip_grad_value_(params, 1.0)
    /// queue.submit([encoder.finish()]);
    /// // grads now hold [0.5, -1.0, NaN]
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn clip_value(&self, encoder: &mut wgpu::CommandEncoder, min: f32, max: f32) -> Result<()> {
        let config = clamp_record(min, max)?;
        if !self.bound.has_elements {
            return Ok(());
        }
        for (_, elem) in self.window_pipelines() {
            self.inner.clamp(elem)?;
        }
        self.begin(encoder, config, false)?;
        let mut pass = self.pass(encoder, "gradclip clamp", None);
        for (bind_group, elem) in self.stream_window_pipelines() {
            pass.set_pipeline(self.inner.clamp(elem)?);
            pass.set_bind_group(0, bind_group, &[]);
            pass.dispatch_workgroups(self.bound.flat_workgroups, 1, 1);
        }
        Ok(())
    }

    /// The checks every recording makes, then the clip's parameters: a norm
    /// clip gets the next step number (returned), and `config` is copied
    /// into the config uniform by a command recorded into `encoder`.
    fn begin(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        config: ClipConfig,
        norm_clip: bool,
    ) -> Result<u64> {
        let step = if norm_clip {
            self.steps.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            0
        };
        self.begin_at(encoder, config, step, true)?;
        Ok(step)
    }

    /// [`begin`](Self::begin) for a clip that takes step number `step`
    /// (0: no norm step): an adaptive clip's second half finishes the step
    /// its `record_norm` began, so a step makes one report. `places`:
    /// upload the plan table and window records of movable bindings (the
    /// second half finds them in place: its first half uploaded them earlier
    /// in the same encoder, and no rebind can come between).
    fn begin_at(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        mut config: ClipConfig,
        step: u64,
        places: bool,
    ) -> Result<()> {
        for buffer in &self.bound.buffers {
            check_recordable(buffer, "gradient buffer")?;
        }
        if step != 0 {
            config.step = step as u32;
            if per_tensor(&config) {
                self.tensor_steps.fetch_max(step, Ordering::AcqRel);
            }
        }
        let uploads = &self.inner.uploads;
        if let Some(movable) = self.bound.movable.as_ref().filter(|_| places) {
            // The places this clip is recorded with, whatever the set's
            // places are when the encoder is submitted.
            uploads.upload(encoder, &movable.table, 0, &movable.table_bytes)?;
            uploads.upload(encoder, &movable.records, 0, &movable.record_bytes)?;
        }
        uploads.upload(encoder, &self.config, 0, bytemuck::bytes_of(&config))
    }

    fn pass<'e>(
        &self,
        encoder: &'e mut wgpu::CommandEncoder,
        label: &'static str,
        timestamp_writes: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> wgpu::ComputePass<'e> {
        encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(label),
            timestamp_writes,
        })
    }

    /// What the set's layout asks of its reduce pipeline for `reduction`.
    fn reduce_needs(&self, reduction: Reduction) -> ReduceNeeds {
        ReduceNeeds {
            shared_chunks: self.bound.shared_chunks,
            fused: self.bound.fused,
            fold_lists: self.bound.fold_lists.get(reduction.general_p()),
            untracked: self.bound.untracked.get(reduction.general_p()),
            segments: self.bound.segments,
        }
    }

    /// Compiles what [`encode_norm`](Self::encode_norm) records, if not yet
    /// compiled: before a clip records anything, so that a failure leaves
    /// the encoder, the step count and the set untouched.
    fn prepare_norm(&self, reduction: Reduction, config: &ClipConfig) -> Result<()> {
        for (_, elem) in self.window_pipelines() {
            self.inner.reduce(
                elem,
                reduction,
                per_tensor(config),
                self.reduce_needs(reduction),
            )?;
        }
        if per_tensor(config) {
            self.inner.tensor_stats(reduction)?;
            if self.bound.long_stat_workgroups > 0 {
                self.inner.long_tensor_stats(reduction)?;
            }
        }
        self.inner.finalize(reduction)?;
        Ok(())
    }

    /// [`prepare_norm`](Self::prepare_norm) for [`encode_scale`](Self::encode_scale).
    pub(crate) fn prepare_scale(&self) -> Result<()> {
        for (_, elem) in self.window_pipelines() {
            self.inner.scale(elem)?;
        }
        Ok(())
    }

    /// [`prepare_norm`](Self::prepare_norm) for a clip with a supplied
    /// total: [`encode_finish`](Self::encode_finish), then
    /// [`encode_scale`](Self::encode_scale) when `scale`.
    fn prepare_finish(&self, reduction: Reduction, scale: bool) -> Result<()> {
        self.inner.finish(reduction)?;
        if scale {
            self.prepare_scale()?;
        }
        Ok(())
    }

    /// The reduce dispatches (one per window) and the finalize dispatch;
    /// timestamps 0, 1 (inside the pass, where the device can) and 2. A
    /// config that asks for per-tensor results takes the `reduce_tensors`
    /// entry point and the per-tensor statistics pass (where some tensor is
    /// not fused), any other `reduce`.
    fn encode_norm(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        reduction: Reduction,
        config: &ClipConfig,
        timing: Timing<'_>,
    ) -> Result<()> {
        let mut pass = self.pass(
            encoder,
            "gradclip reduce + finalize",
            timestamp_writes(timing, 0, 2),
        );
        if self.bound.has_elements {
            // The reduce folds the flat chunks whatever the clip asks for
            // (per-tensor partials come from the same walk), so the global
            // norm's bits never depend on the clip's per-tensor options.
            let [x, y] = self.bound.reduce_grid;
            for (bind_group, elem) in self.window_pipelines() {
                pass.set_pipeline(self.inner.reduce(
                    elem,
                    reduction,
                    per_tensor(config),
                    self.reduce_needs(reduction),
                )?);
                pass.set_bind_group(0, bind_group, &[]);
                pass.dispatch_workgroups(x, y, 1);
            }
        }
        if let Some((query_set, first)) = timing {
            if self
                .inner
                .device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
            {
                pass.write_timestamp(query_set, first + 1);
            }
        }
        pass.set_bind_group(0, &self.bound.bind_groups[0], &[]);
        if per_tensor(config) && self.bound.tensor_stat_workgroups > 0 {
            // The norm and factor of each tensor that is not fused (the
            // reduce gave the others theirs), spread over the device;
            // finalize (one workgroup) then only learns whether any factor
            // is not 1.
            pass.set_pipeline(self.inner.tensor_stats(reduction)?);
            pass.dispatch_workgroups(self.bound.tensor_stat_workgroups, 1, 1);
        }
        if per_tensor(config) && self.bound.long_stat_workgroups > 0 {
            pass.set_pipeline(self.inner.long_tensor_stats(reduction)?);
            pass.dispatch_workgroups(self.bound.long_stat_workgroups, 1, 1);
        }
        pass.set_pipeline(self.inner.finalize(reduction)?);
        pass.dispatch_workgroups(1, 1, 1);
        Ok(())
    }

    /// The finalize dispatch for a supplied total.
    fn encode_finish(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        reduction: Reduction,
    ) -> Result<()> {
        let mut pass = self.pass(encoder, "gradclip finish", None);
        pass.set_pipeline(self.inner.finish(reduction)?);
        pass.set_bind_group(0, &self.bound.bind_groups[0], &[]);
        pass.dispatch_workgroups(1, 1, 1);
        Ok(())
    }

    /// The scale pass, as many workgroups as finalize decided (often none);
    /// timestamps 3 and 4.
    fn encode_scale(&self, encoder: &mut wgpu::CommandEncoder, timing: Timing<'_>) -> Result<()> {
        if !self.bound.has_elements {
            return Ok(());
        }
        // finalize wrote the indirect arguments twice: into the stats, for
        // users' shaders, and into their own buffer, which this pass can
        // read them from because its bind groups leave it out. A copy from
        // the stats instead took 11.5 us on an H200 and 40-60 us on lavapipe.
        let mut pass = self.pass(encoder, "gradclip scale", timestamp_writes(timing, 3, 4));
        for (bind_group, elem) in self.stream_window_pipelines() {
            pass.set_pipeline(self.inner.scale(elem)?);
            pass.set_bind_group(0, bind_group, &[]);
            pass.dispatch_workgroups_indirect(&self.indirect, 0);
        }
        Ok(())
    }
}

/// Whether a clip asks for per-tensor results (norms, or clipping per tensor).
fn per_tensor(config: &ClipConfig) -> bool {
    config.flags & (CFG_TENSOR_NORMS | CFG_PER_TENSOR) != 0
}

/// The config of a clip with a supplied total.
fn supplied_config(clip: &ClipNorm) -> Result<(Reduction, ClipConfig)> {
    if clip.reports_tensor_norms() {
        return Err(Error::Unsupported(
            "per-tensor clipping or norms with a supplied total",
        ));
    }
    let (reduction, mut config) = clip.to_record()?;
    config.flags |= CFG_SUPPLIED;
    Ok((reduction, config))
}
