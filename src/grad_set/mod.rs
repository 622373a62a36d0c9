//! `GradSet`: gradients bound once (one flat buffer, or ranges of several),
//! clipped every step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::clipper::{ElementPipelines, Inner};
use crate::dtype::ElementPath;
use crate::error::Result;
use crate::layout::GradLayout;
use crate::readback::Reader;
use crate::records::{ClipState, STATS_PARTIAL_OFFSET, STATS_SCALER_OFFSET};
use crate::scaler::LossScaler;

mod bind;
mod encode;

/// Gradients bound to a [`Clipper`](crate::Clipper)'s pipelines: owns the
/// plan table, the scratch buffers and the bind groups, all made once in
/// [`Clipper::bind`](crate::Clipper::bind) or
/// [`Clipper::bind_ranges`](crate::Clipper::bind_ranges) (and remade, keeping
/// the scratch, by [`rebind_ranges`](Self::rebind_ranges)). Each clip records
/// a fixed number of passes — one dispatch per binding window, whatever the
/// tensor count — into the caller's encoder, and allocates nothing on the
/// GPU.
///
/// A `GradSet` is `Send + Sync` natively: threads may record clips on one
/// set into their own encoders at once; each clip carries its own
/// parameters and step number in its commands.
#[derive(Debug)]
pub struct GradSet {
    inner: Arc<Inner>,
    layout: GradLayout,
    /// What depends on where the gradients are: remade by a rebind.
    bound: bind::Bindings,
    /// Scratch for the reduce pass's partials (grown by a rebind only if the
    /// new places need more).
    partials: wgpu::Buffer,
    stats: wgpu::Buffer,
    indirect: wgpu::Buffer,
    /// The current clip's `ClipConfig`, written by each clip's own commands.
    config: wgpu::Buffer,
    /// Norm clips recorded so far: the next one is step `steps + 1`.
    steps: AtomicU64,
    /// The latest step that asked for per-tensor norms (0: none).
    tensor_steps: AtomicU64,
    rebinds: u64,
    /// Rebinds that had to build new bind groups (not a return to the
    /// previous places).
    rebuilds: u64,
    /// The bindings (and partials scratch) in use before the latest build:
    /// a pool that alternates between two buffers switches back for free.
    previous: Option<(bind::Bindings, wgpu::Buffer)>,
    /// Partial sources and query sets found to be of this device.
    verified: encode::Verified,
    reader: Reader,
}

#[cfg(not(target_arch = "wasm32"))]
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<GradSet>();
    send_sync::<crate::Clipper>();
};

impl GradSet {
    /// The layout this set was bound with.
    pub fn layout(&self) -> &GradLayout {
        &self.layout
    }

    /// Elements of one flat chunk of this set: the unit of work of one
    /// workgroup in the reduce and scale passes and the granularity of the
    /// global partials (a tensor's segments, its parts of one chunk, are
    /// never longer). 32768 on GPUs; on CPU adapters (lavapipe, llvmpipe,
    /// SwiftShader), where each chunk's fixed cost is larger, up to 131072
    /// for sets with the elements to make at least 64 chunks. Like
    /// [`Clipper::workgroup_size`](crate::Clipper::workgroup_size) it sets
    /// the order of the sums: results repeat bit for bit for one layout on
    /// one adapter.
    pub fn chunk_elements(&self) -> u32 {
        self.bound.chunk_elements
    }

    /// Number of binding windows: one per stretch of a buffer that fits the
    /// device's storage binding limit (1 for a single buffer under 128 MiB).
    pub fn window_count(&self) -> usize {
        self.bound.bind_groups.len()
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
        &self.bound.paths
    }

    /// How many times [`rebind_ranges`](Self::rebind_ranges) moved this set
    /// to new places (calls that found the places unchanged do not count).
    pub fn rebind_count(&self) -> u64 {
        self.rebinds
    }

    /// Of those rebinds, how many built new bind groups; the others moved
    /// the set's bindings by new table bytes (copied in by each clip) or
    /// went back to the bindings kept from before the latest build: no GPU
    /// object made.
    pub fn rebuild_count(&self) -> u64 {
        self.rebuilds
    }

    /// Norm clips recorded on this set so far (the step number of the latest).
    pub fn steps_recorded(&self) -> u64 {
        self.steps.load(Ordering::Acquire)
    }

    /// The clip state finalize writes: a binding of the
    /// [`ClipState`](crate::records::ClipState) record (64 bytes at offset 0
    /// of the stats buffer), for an optimizer shader that multiplies by the
    /// clip factor on load instead of a separate scale pass, or a loss shader
    /// that multiplies the loss by the loss scale. Its WGSL declaration, and
    /// `clip_apply(g, clip)` which multiplies exactly as the scale pass does,
    /// are [`wgsl::CLIP_STATE`](crate::wgsl::CLIP_STATE); the layout entry is
    /// [`wgsl::clip_state_layout_entry`](crate::wgsl::clip_state_layout_entry).
    ///
    /// `clip_apply` reproduces every case (0 or NaN for non-finite norms;
    /// `clip / S` when the clip unscales; factors below `f32::MIN_POSITIVE`
    /// without flushing). With `error_if_nonfinite` or an unscaling clip that
    /// found an inf, the factor is 1 and `nonfinite != 0` / `found_inf != 0`
    /// say the step should be skipped. `loss_scale` is the scale for the next
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
    /// [`partial_offset`](Self::partial_offset), the loss scaler's
    /// parameters, the report log, then one
    /// [`TensorStat`](crate::records::TensorStat) per tensor.
    pub fn stats_buffer(&self) -> &wgpu::Buffer {
        &self.stats
    }

    /// Byte offset of this set's 16-byte [`NormPartial`](crate::NormPartial)
    /// in [`stats_buffer`](Self::stats_buffer), to copy to other ranks on the
    /// GPU (for instance as the source of another set's
    /// [`clip_with_partial_from`](Self::clip_with_partial_from)).
    pub fn partial_offset(&self) -> u64 {
        STATS_PARTIAL_OFFSET
    }

    /// Sets the loss scale to `scaler`'s initial scale, its growth tracker to
    /// 0 and its update parameters, for the unscaling clips
    /// ([`ClipNorm::unscale`](crate::ClipNorm::unscale)) of the next
    /// submission on (it is a `queue.write_buffer`, so it lands before the
    /// next submission, ahead of clips recorded earlier but submitted then).
    /// Without it a set uses GradScaler's defaults. Invalid parameters are an
    /// error and change nothing.
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
        let state = bind::initial_state(scaler);
        let first = core::mem::offset_of!(ClipState, loss_scale);
        let end = core::mem::offset_of!(ClipState, step);
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

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    pub(crate) fn reader(&self) -> &Reader {
        &self.reader
    }

    /// The latest step that asked for per-tensor norms (0: none yet).
    pub(crate) fn tensor_steps(&self) -> u64 {
        self.tensor_steps.load(Ordering::Acquire)
    }

    fn window_pipelines(&self) -> impl Iterator<Item = (&wgpu::BindGroup, &ElementPipelines)> {
        self.bound
            .bind_groups
            .iter()
            .zip(self.bound.window_pipelines.iter().map(|p| p.as_ref()))
    }

    /// [`window_pipelines`](Self::window_pipelines) with the bind groups of
    /// the scale and clamp passes.
    fn stream_window_pipelines(
        &self,
    ) -> impl Iterator<Item = (&wgpu::BindGroup, &ElementPipelines)> {
        self.bound
            .stream_bind_groups
            .iter()
            .zip(self.bound.window_pipelines.iter().map(|p| p.as_ref()))
    }
}
