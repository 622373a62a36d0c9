//! `GradSet`: gradients bound once (one flat buffer, or ranges of several),
//! clipped every step.

use std::sync::{Arc, Mutex};

use crate::clipper::{ElementPipelines, Inner};
use crate::config::{clamp_record, ClipNorm};
use crate::dtype::ElementPath;
use crate::error::{Error, Result};
use crate::layout::GradLayout;
use crate::records::{ClipState, Partial, CFG_NO_SCALE, STATS_PARTIAL_OFFSET, STATS_SCALER_OFFSET};
use crate::report::{ClipReport, ReportRing};
use crate::scaler::LossScaler;

mod bind;
mod encode;

pub(crate) use bind::require_storage;
use bind::{initial_state, too_large};
use encode::{ConfigCache, Timing};

/// Elements of one chunk: the unit of work of one workgroup in the reduce
/// and scale passes, and the granularity of the partials.
pub const CHUNK_ELEMENTS: u32 = 8192;
/// Upper bound on the workgroups of a grid-stride dispatch.
const MAX_WORKGROUPS: u32 = 2048;
/// Distinct clip configurations kept on the GPU at once.
const CONFIG_SLOTS: u64 = 16;

/// Gradients bound to a [`Clipper`](crate::Clipper)'s pipelines: owns the
/// chunk table, the scratch buffers and the bind groups, all made once in
/// [`Clipper::bind`](crate::Clipper::bind) or
/// [`Clipper::bind_ranges`](crate::Clipper::bind_ranges). Each clip records
/// a fixed number of passes — one dispatch per binding window, whatever the
/// tensor count — and allocates nothing.
#[derive(Debug)]
pub struct GradSet {
    inner: Arc<Inner>,
    layout: GradLayout,
    /// One per binding window (one placeholder when there is no element).
    bind_groups: Vec<wgpu::BindGroup>,
    /// The reduce / scale pipelines of each binding window's element path.
    window_pipelines: Vec<Arc<ElementPipelines>>,
    /// The distinct element paths of the windows, sorted.
    paths: Vec<ElementPath>,
    has_elements: bool,
    stats: wgpu::Buffer,
    indirect: wgpu::Buffer,
    uniforms: wgpu::Buffer,
    uniform_stride: u64,
    config_base: u64,
    /// Grid-stride workgroups over per-tensor chunks, and over flat chunks.
    workgroups: u32,
    flat_workgroups: u32,
    configs: Mutex<ConfigCache>,
    reports: ReportRing,
    steps: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GradSet {
    /// The layout this set was bound with.
    pub fn layout(&self) -> &GradLayout {
        &self.layout
    }

    /// Number of binding windows: one per stretch of a buffer that fits the
    /// device's storage binding limit (1 for a single buffer under 128 MiB).
    pub fn window_count(&self) -> usize {
        self.bind_groups.len()
    }

    /// The element paths this set's binding windows take, sorted and
    /// without repeats: which shader reads each kind of buffer (say
    /// [`ElementPath::F16Packed`] on GL, or with
    /// [`Clipper::without_shader_f16`](crate::Clipper::without_shader_f16)).
    /// Empty for a layout without elements.
    ///
    /// ```
    /// # let (device, queue, _) = pollster::block_on(gradclip::default_device())?;
    /// use gradclip::{ElementPath, GradLayout, GradType};
    /// let clipper = gradclip::Clipper::without_shader_f16(&device, &queue)?;
    /// let grads = device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("f16 grads"), size: 64, usage: wgpu::BufferUsages::STORAGE,
    ///     mapped_at_creation: false });
    /// let set = clipper.bind_as(&grads, &GradLayout::from_sizes(&[31])?, GradType::F16)?;
    /// assert_eq!(set.element_paths(), [ElementPath::F16Packed]);
    /// assert_eq!(set.element_paths()[0].grad_type(), GradType::F16);
    /// # Ok::<(), gradclip::Error>(())
    /// ```
    pub fn element_paths(&self) -> &[ElementPath] {
        &self.paths
    }

    /// The clip state finalize writes: a binding of the
    /// [`ClipState`](crate::records::ClipState) record (48 bytes at offset 0
    /// of the stats buffer), for an optimizer shader that multiplies by the
    /// coefficient on load instead of a separate scale pass, or a loss
    /// shader that multiplies the loss by the loss scale:
    ///
    /// ```wgsl
    /// struct ClipState { total_norm: f32, coefficient: f32, nonfinite: u32,
    ///                    scale_kind: u32, dispatch: array<u32, 3>, found_inf: u32,
    ///                    loss_scale: f32, unscaled_by: f32, growth_tracker: u32, _pad: u32 }
    /// @group(0) @binding(3) var<storage, read> clip: ClipState;
    /// ```
    ///
    /// A plain multiply by `coefficient` reproduces every case (0 or NaN for
    /// non-finite norms; `clip / S` when the clip unscales); with
    /// `error_if_nonfinite` or an unscaling clip that found an inf,
    /// `coefficient` is 1 and `nonfinite != 0` / `found_inf != 0` say the
    /// step should be skipped. `loss_scale` is the scale for the next
    /// backward pass (already updated by the clip).
    pub fn coefficient_binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: &self.stats,
            offset: 0,
            size: wgpu::BufferSize::new(size_of::<ClipState>() as u64),
        }
    }

    /// The stats buffer (`COPY_SRC`): [`ClipState`](crate::records::ClipState)
    /// at offset 0, this set's [`NormPartial`](crate::NormPartial) at
    /// [`partial_offset`](Self::partial_offset), then one
    /// [`TensorStat`](crate::records::TensorStat) per tensor.
    pub fn stats_buffer(&self) -> &wgpu::Buffer {
        &self.stats
    }

    /// Byte offset of this set's 16-byte [`NormPartial`](crate::NormPartial)
    /// in [`stats_buffer`](Self::stats_buffer), to copy to other ranks on the GPU.
    pub fn partial_offset(&self) -> u64 {
        STATS_PARTIAL_OFFSET
    }

    /// Sets the loss scale to `scaler`'s initial scale, its growth tracker to
    /// 0 and its update parameters, for the unscaling clips
    /// ([`ClipNorm::unscale`](crate::ClipNorm::unscale)) submitted after this
    /// call (it is a `queue.write_buffer`, so it lands before the next
    /// submission). Without it a set uses GradScaler's defaults. Invalid
    /// parameters are an error and change nothing.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// // f32 gradients of a loss scaled by 1024.
    /// let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: None, contents: bytemuck::cast_slice(&[3072.0f32, 4096.0]),
    ///     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
    /// set.set_loss_scaler(&gradclip::LossScaler::new().init_scale(1024.0).growth_interval(1))?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.clip_norm(&mut encoder, &gradclip::ClipNorm::new(10.0).unscale(true))?;
    /// queue.submit([encoder.finish()]);
    /// let report = set.read_report().await?;
    /// assert_eq!((report.total_norm, report.found_inf), (5.0, false));
    /// assert_eq!((report.unscaled_by, report.loss_scale), (1024.0, 2048.0)); // grew after 1 step
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn set_loss_scaler(&self, scaler: &LossScaler) -> Result<()> {
        scaler.check()?;
        let state = initial_state(scaler);
        let first = core::mem::offset_of!(ClipState, loss_scale);
        let end = core::mem::offset_of!(ClipState, _pad);
        let queue = &self.inner.queue;
        // Only the scale fields: a clip's results stay readable.
        queue.write_buffer(
            &self.stats,
            first as u64,
            &bytemuck::bytes_of(&state)[first..end],
        );
        queue.write_buffer(
            &self.stats,
            STATS_SCALER_OFFSET,
            bytemuck::bytes_of(&scaler.config()),
        );
        Ok(())
    }

    /// Records a norm clip into `encoder`: the reduce pass, the finalize
    /// dispatch and the in-place scale pass, whose workgroup count finalize
    /// sets on the GPU (zero when every coefficient is exactly 1). Global by
    /// default, per tensor with [`ClipNorm::per_tensor`]. Nothing is read
    /// back unless a report is awaited.
    ///
    /// Invalid parameters return an error before anything is recorded.
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
        self.record_clip_norm(encoder, clip, None)
    }

    /// Timestamp queries written by one [`clip_norm_timed`](Self::clip_norm_timed).
    pub const CLIP_TIMESTAMPS: u32 = 5;

    /// [`clip_norm`](Self::clip_norm) plus GPU timestamps, for benchmarks and
    /// profilers; the recorded work is otherwise identical. Writes
    /// `query_set[first_index + k]` for k = 0: the reduce pass begins;
    /// 1: reduce is done, finalize begins (only on devices with
    /// `Features::TIMESTAMP_QUERY_INSIDE_PASSES`); 2: finalize is done;
    /// 3 and 4: the scale pass begins and ends (not written for a layout
    /// without elements). Between 2 and 3 the indirect arguments are copied.
    ///
    /// Needs `Features::TIMESTAMP_QUERY` and a `QueryType::Timestamp` set with
    /// room for [`CLIP_TIMESTAMPS`](Self::CLIP_TIMESTAMPS) queries from `first_index`.
    pub fn clip_norm_timed(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        query_set: &wgpu::QuerySet,
        first_index: u32,
    ) -> Result<()> {
        if !self
            .inner
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Err(Error::UnsupportedDevice {
                what: "timestamp queries",
                have: 0,
                need: 1,
            });
        }
        too_large(
            "timestamp query index",
            first_index as u64 + Self::CLIP_TIMESTAMPS as u64,
            query_set.count() as u64,
        )?;
        self.record_clip_norm(encoder, clip, Some((query_set, first_index)))
    }

    fn record_clip_norm(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        timing: Timing<'_>,
    ) -> Result<()> {
        let (reduction, config) = clip.to_record()?;
        let offset = self.config_offset(config);
        self.encode_norm(encoder, reduction, &config, offset, timing);
        self.encode_scale(encoder, offset, timing);
        self.record_report(encoder, &config, clip);
        Ok(())
    }

    /// Records the norm, the coefficient and this set's
    /// [`NormPartial`](crate::NormPartial) without touching the gradients
    /// (PyTorch's `get_total_norm`): for an optimizer that multiplies by
    /// [`coefficient_binding`](Self::coefficient_binding) on load, or for a
    /// shard whose partial is combined with other ranks' before
    /// [`clip_with_partial`](Self::clip_with_partial).
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
        let (reduction, mut config) = clip.to_record()?;
        config.flags |= CFG_NO_SCALE;
        let offset = self.config_offset(config);
        self.encode_norm(encoder, reduction, &config, offset, None);
        self.record_report(encoder, &config, clip);
        Ok(())
    }

    /// Clips with a total that the caller supplies (PyTorch's
    /// `clip_grads_with_norm_`): the 16-byte [`NormPartial`](crate::NormPartial)
    /// at `offset` of `source` (usage `COPY_SRC`), typically all ranks'
    /// partials [combined](crate::NormPartial::combine). Copies it into this
    /// set, computes the coefficient from it and scales; the gradients are
    /// not reduced again. The report's norm is the combined one.
    ///
    /// Per-tensor clipping has no global total to supply: it is rejected.
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
    ///     partials.push(set.read_report().await?.partial);
    /// }
    /// // The all-reduce, then every rank clips with the combined norm.
    /// let combined = gradclip::NormPartial::combine(&partials, gradclip::Norm::L2)?;
    /// let source = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: Some("combined"), contents: &combined.to_bytes(), usage: wgpu::BufferUsages::COPY_SRC });
    /// for set in &sets {
    ///     let mut encoder = device.create_command_encoder(&Default::default());
    ///     set.clip_with_partial(&mut encoder, &clip, &source, 0)?;
    ///     queue.submit([encoder.finish()]);
    ///     assert_eq!(set.read_report().await?.total_norm, 5.0);
    /// }
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn clip_with_partial(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        source: &wgpu::Buffer,
        offset: u64,
    ) -> Result<()> {
        if clip.is_per_tensor() {
            return Err(Error::Unsupported(
                "per-tensor clipping with a supplied total",
            ));
        }
        let (reduction, config) = clip.to_record()?;
        if !source.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::MissingUsage {
                missing: wgpu::BufferUsages::COPY_SRC,
            });
        }
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
        let config_offset = self.config_offset(config);
        encoder.copy_buffer_to_buffer(source, offset, &self.stats, STATS_PARTIAL_OFFSET, bytes);
        {
            let mut pass = self.pass(encoder, "gradclip finish", None);
            pass.set_pipeline(self.inner.pipelines.finish(reduction));
            pass.set_bind_group(0, &self.bind_groups[0], &[config_offset]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        self.encode_scale(encoder, config_offset, None);
        self.record_report(encoder, &config, clip);
        Ok(())
    }

    /// Records value clipping: every element clamped to `[min, max]` in
    /// place (PyTorch's `clip_grad_value_(v)` is `min = -v, max = v`). NaN
    /// stays NaN; ±inf become the bounds. Leaves the reports alone.
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
        let offset = self.config_offset(clamp_record(min, max)?);
        if !self.has_elements {
            return Ok(());
        }
        let mut pass = self.pass(encoder, "gradclip clamp", None);
        for (bind_group, elem) in self.bind_groups.iter().zip(&self.window_pipelines) {
            pass.set_pipeline(&elem.clamp);
            pass.set_bind_group(0, bind_group, &[offset]);
            pass.dispatch_workgroups(self.flat_workgroups, 1, 1);
        }
        Ok(())
    }

    /// The report of the latest norm clip recorded on this set and submitted.
    /// Natively it drives the device until the submitted work is done; in the
    /// browser it waits for the work submitted so far (never for a step that
    /// was recorded but not submitted). Further steps can be recorded
    /// and submitted while it is pending, and it never has to be called.
    /// Returns [`Error::NonFinite`] for a clip made with `error_if_nonfinite`
    /// whose norm was NaN or infinite.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[f32::INFINITY, 1.0]),
    /// #     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.clip_norm(&mut encoder, &gradclip::ClipNorm::new(1.0).error_if_nonfinite(true))?;
    /// queue.submit([encoder.finish()]);
    /// let error = set.read_report().await.unwrap_err();
    /// assert_eq!(error, gradclip::Error::NonFinite { total_norm: f32::INFINITY });
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub async fn read_report(&self) -> Result<ClipReport> {
        self.reports
            .latest(&self.inner.device, &self.inner.queue)
            .await
    }

    /// Every report that came back since the last call, oldest first: one
    /// per submitted step, as long as no more than 16 steps are in flight
    /// unread (older ones are then overwritten). A training loop can log the
    /// norm of every step without ever stalling on one. `error_if_nonfinite`
    /// shows here as `nonfinite` on the report rather than as an error.
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
    /// for max_norm in [4.0, 2.0, 1.0] {
    ///     let mut encoder = device.create_command_encoder(&Default::default());
    ///     set.clip_norm(&mut encoder, &gradclip::ClipNorm::tensorflow(max_norm))?;
    ///     queue.submit([encoder.finish()]); // no wait between steps
    /// }
    /// let norms: Vec<f32> = set.take_reports().await?.iter().map(|r| r.total_norm).collect();
    /// assert_eq!(norms, [5.0, 4.0, 2.0]);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub async fn take_reports(&self) -> Result<Vec<ClipReport>> {
        self.reports
            .take_all(&self.inner.device, &self.inner.queue)
            .await
    }
}
