//! `GradSet`: gradients bound once (one flat buffer, or ranges of several),
//! clipped every step.

use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use crate::clipper::{ElementPipelines, Inner};
use crate::config::{clamp_record, ClipNorm, Reduction};
use crate::dtype::ElementPath;
use crate::dtype::GradType;
use crate::error::{Error, Result};
use crate::gpu_errors::Catch;
use crate::layout::{plan, GradLayout, Placement, Window};
use crate::records::{
    Chunk, ClipConfig, ClipState, Partial, TensorStat, WindowInfo, CFG_NO_SCALE, CFG_PER_TENSOR,
    CFG_TENSOR_NORMS, DISPATCH_OFFSET, DISPATCH_SIZE, STATS_HEAD_SIZE, STATS_PARTIAL_OFFSET,
    STATS_SCALER_OFFSET,
};
use crate::report::{ClipReport, ReportRing};
use crate::scaler::LossScaler;

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

/// Where `clip_norm_timed` writes its timestamps: a query set and the first index.
type Timing<'a> = Option<(&'a wgpu::QuerySet, u32)>;

trait TimingWrites<'a> {
    fn writes(self, begin: u32, end: u32) -> Option<wgpu::ComputePassTimestampWrites<'a>>;
}

impl<'a> TimingWrites<'a> for Timing<'a> {
    /// Timestamps at the beginning and end of a pass, `begin` and `end` past the first index.
    fn writes(self, begin: u32, end: u32) -> Option<wgpu::ComputePassTimestampWrites<'a>> {
        self.map(|(query_set, first)| wgpu::ComputePassTimestampWrites {
            query_set,
            beginning_of_pass_write_index: Some(first + begin),
            end_of_pass_write_index: Some(first + end),
        })
    }
}

/// Which clip configurations are in which uniform slot.
#[derive(Debug, Default)]
struct ConfigCache {
    slots: Vec<ClipConfig>,
    next: usize,
}

fn align_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

fn too_large(what: &'static str, needed: u64, limit: u64) -> Result<()> {
    if needed > limit {
        return Err(Error::TooLarge {
            what,
            needed,
            limit,
        });
    }
    Ok(())
}

pub(crate) fn require_storage(buffer: &wgpu::Buffer) -> Result<()> {
    if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
        return Err(Error::MissingUsage {
            missing: wgpu::BufferUsages::STORAGE,
        });
    }
    Ok(())
}

/// The loss-scale fields of a fresh `ClipState` for `scaler`.
fn initial_state(scaler: &LossScaler) -> ClipState {
    ClipState {
        coefficient: 1.0,
        loss_scale: scaler.init_scale_value(),
        unscaled_by: 1.0,
        ..ClipState::default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GradSet {
    /// `buffers` are the distinct gradient buffers (checked by the caller);
    /// `placements[t]` says where tensor `t` of `layout` lives in them.
    pub(crate) fn new(
        inner: Arc<Inner>,
        buffers: &[&wgpu::Buffer],
        placements: &[Placement],
        layout: &GradLayout,
    ) -> Result<Self> {
        let device = &inner.device;
        let limits = device.limits();
        // Windows start at multiples of the storage offset alignment and stay
        // under both the binding limit and the 2^32 elements a u32 can index.
        let align = (limits.min_storage_buffer_offset_alignment as u64).max(4);
        let max_binding = limits.max_storage_buffer_binding_size.min(u32::MAX as u64) / 4 * 4;
        too_large("storage offset alignment", align, max_binding)?;
        let plan = plan(
            layout,
            placements,
            CHUNK_ELEMENTS,
            max_binding / align * align,
            align,
        )?;
        let chunk_count = plan.chunks.len() as u64;
        let flat_count = plan.flat.len() as u64;
        let table_len = chunk_count + flat_count;
        let tensor_count = layout.len() as u64;
        too_large(
            "chunk table bytes",
            table_len * size_of::<Chunk>() as u64,
            max_binding,
        )?;
        too_large(
            "partials bytes",
            table_len * size_of::<Partial>() as u64,
            max_binding,
        )?;
        let stats_size = STATS_HEAD_SIZE + tensor_count.max(1) * size_of::<TensorStat>() as u64;
        too_large("per-tensor statistics bytes", stats_size, max_binding)?;

        // Enough workgroups for the busiest window, within the dispatch limit.
        let cap = MAX_WORKGROUPS.min(limits.max_compute_workgroups_per_dimension);
        let busiest = |count: fn(&Window) -> u32| {
            plan.windows
                .iter()
                .map(count)
                .max()
                .unwrap_or(1)
                .clamp(1, cap)
        };
        let workgroups = busiest(|w| w.chunk_end - w.chunk_begin);
        let flat_workgroups = busiest(|w| w.flat_end - w.flat_begin);

        let uniform_stride = align_up(
            size_of::<ClipConfig>().max(size_of::<WindowInfo>()) as u64,
            limits.min_uniform_buffer_offset_alignment as u64,
        );
        let empty = Window {
            buffer: 0,
            dtype: GradType::F32,
            byte_offset: 0,
            bytes: 0,
            chunk_begin: 0,
            chunk_end: 0,
            flat_begin: 0,
            flat_end: 0,
        };
        let window_infos: Vec<WindowInfo> = plan
            .windows
            .iter()
            .chain(plan.windows.is_empty().then_some(&empty))
            .map(|w| WindowInfo {
                chunk_begin: w.chunk_begin,
                chunk_end: w.chunk_end,
                chunk_count: chunk_count as u32,
                workgroups,
                tensor_count: tensor_count as u32,
                flat_begin: chunk_count as u32 + w.flat_begin,
                flat_end: chunk_count as u32 + w.flat_end,
                flat_count: flat_count as u32,
                flat_workgroups,
            })
            .collect();
        let config_base = window_infos.len() as u64 * uniform_stride;
        let mut uniform_bytes = vec![0u8; (config_base + CONFIG_SLOTS * uniform_stride) as usize];
        for (k, info) in window_infos.iter().enumerate() {
            let at = k * uniform_stride as usize;
            uniform_bytes[at..at + size_of::<WindowInfo>()]
                .copy_from_slice(bytemuck::bytes_of(info));
        }
        let window_pipelines = plan
            .windows
            .iter()
            .map(|w| inner.element_pipelines(inner.path_of(w.dtype)))
            .collect::<Result<Vec<_>>>()?;
        let mut paths: Vec<ElementPath> = plan
            .windows
            .iter()
            .map(|w| inner.path_of(w.dtype))
            .collect();
        paths.sort();
        paths.dedup();
        // The loss scale starts as GradScaler's default; set_loss_scaler changes it.
        let scaler = LossScaler::new();
        let mut stats_bytes = vec![0u8; STATS_HEAD_SIZE as usize];
        let state = initial_state(&scaler);
        stats_bytes[..size_of::<ClipState>()].copy_from_slice(bytemuck::bytes_of(&state));
        let at = STATS_SCALER_OFFSET as usize;
        stats_bytes[at..at + size_of::<crate::records::ScalerConfig>()]
            .copy_from_slice(bytemuck::bytes_of(&scaler.config()));
        for &(chunk_begin, chunk_end) in plan
            .tensor_chunks
            .iter()
            .chain([(0, 0)].iter().take(usize::from(tensor_count == 0)))
        {
            let stat = TensorStat {
                chunk_begin,
                chunk_end,
                norm: 0.0,
                coefficient: 1.0,
            };
            stats_bytes.extend_from_slice(bytemuck::bytes_of(&stat));
        }
        // Empty tables still need a non-empty binding.
        let mut table: Vec<Chunk> = plan.chunks.iter().chain(&plan.flat).copied().collect();
        if table.is_empty() {
            table.push(Chunk::default());
        }

        let catch = Catch::begin(device);
        let storage = wgpu::BufferUsages::STORAGE;
        let chunks = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("gradclip chunk table"),
            contents: bytemuck::cast_slice(&table),
            usage: storage,
        });
        let partials = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip partials"),
            size: table_len.max(1) * size_of::<Partial>() as u64,
            usage: storage,
            mapped_at_creation: false,
        });
        let stats = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("gradclip stats"),
            contents: &stats_bytes,
            usage: storage | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        });
        let indirect = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip scale dispatch"),
            size: DISPATCH_SIZE,
            usage: wgpu::BufferUsages::INDIRECT | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let uniforms = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("gradclip uniforms"),
            contents: &uniform_bytes,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        });
        // With no element to bind, a tiny buffer of our own stands in.
        let placeholder = plan.windows.is_empty().then(|| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gradclip empty gradients"),
                size: 16,
                usage: storage,
                mapped_at_creation: false,
            })
        });
        let grad_ranges: Vec<(&wgpu::Buffer, u64, u64)> = match &placeholder {
            Some(buffer) => vec![(buffer, 0, 16)],
            None => plan
                .windows
                .iter()
                .map(|w| (buffers[w.buffer], w.byte_offset, w.bytes))
                .collect(),
        };
        fn buffer_entry(
            binding: u32,
            buffer: &wgpu::Buffer,
            offset: u64,
            size: u64,
        ) -> wgpu::BindGroupEntry<'_> {
            wgpu::BindGroupEntry {
                binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset,
                    size: wgpu::BufferSize::new(size),
                }),
            }
        }
        let whole = |binding, buffer| buffer_entry(binding, buffer, 0, buffer.size());
        let bind_groups = grad_ranges
            .iter()
            .enumerate()
            .map(|(k, &(buffer, offset, size))| {
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&format!("gradclip bind group, window {k}")),
                    layout: &inner.bind_group_layout,
                    entries: &[
                        buffer_entry(0, buffer, offset, size),
                        whole(1, &chunks),
                        whole(2, &partials),
                        whole(3, &stats),
                        buffer_entry(
                            4,
                            &uniforms,
                            k as u64 * uniform_stride,
                            size_of::<WindowInfo>() as u64,
                        ),
                        buffer_entry(5, &uniforms, config_base, size_of::<ClipConfig>() as u64),
                    ],
                })
            })
            .collect();
        let reports = ReportRing::new(device, layout.len());
        catch.end()?;

        Ok(Self {
            layout: layout.clone(),
            has_elements: !plan.windows.is_empty(),
            bind_groups,
            window_pipelines,
            paths,
            stats,
            indirect,
            uniforms,
            uniform_stride,
            config_base,
            workgroups,
            flat_workgroups,
            configs: Mutex::new(ConfigCache::default()),
            reports,
            steps: Mutex::new(0),
            inner,
        })
    }

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

    /// Dynamic offset of the uniform slot holding `config`; uploads it the
    /// first time it is seen. Slots are reused round-robin past
    /// `CONFIG_SLOTS` distinct configurations.
    fn config_offset(&self, config: ClipConfig) -> u32 {
        let mut cache = lock(&self.configs);
        let slot = match cache.slots.iter().position(|c| c.same_bits(&config)) {
            Some(slot) => slot,
            None => {
                let slot = if (cache.slots.len() as u64) < CONFIG_SLOTS {
                    cache.slots.push(config);
                    cache.slots.len() - 1
                } else {
                    let slot = cache.next;
                    cache.next = (slot + 1) % CONFIG_SLOTS as usize;
                    cache.slots[slot] = config;
                    slot
                };
                self.inner.queue.write_buffer(
                    &self.uniforms,
                    self.config_base + slot as u64 * self.uniform_stride,
                    bytemuck::bytes_of(&config),
                );
                slot
            }
        };
        (slot as u64 * self.uniform_stride) as u32
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

    /// The workgroups the shaders stride with for `config` (WGSL's
    /// `stride_workgroups()`): per-tensor chunks when per-tensor results are
    /// asked for, flat chunks otherwise.
    fn workgroups_for(&self, config: &ClipConfig) -> u32 {
        if config.flags & (CFG_TENSOR_NORMS | CFG_PER_TENSOR) != 0 {
            self.workgroups
        } else {
            self.flat_workgroups
        }
    }

    /// The reduce dispatches (one per window) and the finalize dispatch;
    /// timestamps 0, 1 (inside the pass, where the device can) and 2.
    fn encode_norm(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        reduction: Reduction,
        config: &ClipConfig,
        offset: u32,
        timing: Timing<'_>,
    ) {
        let pipelines = &self.inner.pipelines;
        let mut pass = self.pass(encoder, "gradclip reduce + finalize", timing.writes(0, 2));
        if self.has_elements {
            for (bind_group, elem) in self.bind_groups.iter().zip(&self.window_pipelines) {
                pass.set_pipeline(elem.reduce(reduction));
                pass.set_bind_group(0, bind_group, &[offset]);
                pass.dispatch_workgroups(self.workgroups_for(config), 1, 1);
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
        pass.set_pipeline(pipelines.finalize(reduction));
        pass.set_bind_group(0, &self.bind_groups[0], &[offset]);
        pass.dispatch_workgroups(1, 1, 1);
    }

    /// The scale pass, as many workgroups as finalize decided (often none);
    /// timestamps 3 and 4.
    fn encode_scale(&self, encoder: &mut wgpu::CommandEncoder, offset: u32, timing: Timing<'_>) {
        if !self.has_elements {
            return;
        }
        // The indirect arguments cannot be read from the stats binding
        // itself: a buffer may not be both storage and indirect in one dispatch.
        encoder.copy_buffer_to_buffer(
            &self.stats,
            DISPATCH_OFFSET,
            &self.indirect,
            0,
            DISPATCH_SIZE,
        );
        let mut pass = self.pass(encoder, "gradclip scale", timing.writes(3, 4));
        for (bind_group, elem) in self.bind_groups.iter().zip(&self.window_pipelines) {
            pass.set_pipeline(&elem.scale);
            pass.set_bind_group(0, bind_group, &[offset]);
            pass.dispatch_workgroups_indirect(&self.indirect, 0);
        }
    }

    fn record_report(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        config: &ClipConfig,
        clip: &ClipNorm,
    ) {
        let step = {
            let mut steps = lock(&self.steps);
            *steps += 1;
            *steps
        };
        let tensors = clip.reports_tensor_norms();
        self.reports.record(
            encoder,
            &self.stats,
            step,
            config.error_if_nonfinite != 0,
            tensors,
        );
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
