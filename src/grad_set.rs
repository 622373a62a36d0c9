//! `GradSet`: one gradient buffer with its layout, bound once, clipped every step.

use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use crate::clipper::Inner;
use crate::config::{clamp_record, ClipNorm};
use crate::error::{Error, Result};
use crate::gpu_errors::Catch;
use crate::layout::{plan, GradLayout, Window};
use crate::records::{
    Chunk, ClipConfig, ClipState, Partial, WindowInfo, DISPATCH_OFFSET, DISPATCH_SIZE,
};
use crate::report::{ClipReport, ReportRing};

/// Elements of one chunk: the unit of work of one workgroup in the reduce
/// and scale passes, and the granularity of the partials.
pub const CHUNK_ELEMENTS: u32 = 8192;
/// Upper bound on the workgroups of a grid-stride dispatch.
const MAX_WORKGROUPS: u32 = 2048;
/// Distinct clip configurations kept on the GPU at once.
const CONFIG_SLOTS: u64 = 16;

/// A gradient buffer and its layout, bound to a [`Clipper`](crate::Clipper)'s
/// pipelines: owns the chunk table, the scratch buffers and the bind groups,
/// all made once in [`Clipper::bind`](crate::Clipper::bind). Each clip records
/// a fixed number of passes whatever the tensor count, and allocates nothing.
#[derive(Debug)]
pub struct GradSet {
    inner: Arc<Inner>,
    layout: GradLayout,
    windows: Vec<Window>,
    /// One per binding window (one placeholder when the layout has no element).
    bind_groups: Vec<wgpu::BindGroup>,
    state: wgpu::Buffer,
    indirect: wgpu::Buffer,
    uniforms: wgpu::Buffer,
    uniform_stride: u64,
    config_base: u64,
    workgroups: u32,
    configs: Mutex<ConfigCache>,
    reports: ReportRing,
    steps: Mutex<u64>,
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

impl GradSet {
    pub(crate) fn new(
        inner: Arc<Inner>,
        grads: &wgpu::Buffer,
        layout: &GradLayout,
    ) -> Result<Self> {
        let device = &inner.device;
        let limits = device.limits();
        if !grads.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::MissingUsage {
                missing: wgpu::BufferUsages::STORAGE,
            });
        }
        let needed = layout
            .total_elements()
            .checked_mul(4)
            .ok_or(Error::LayoutOverflow)?;
        too_large("layout size in bytes", needed, limits.max_buffer_size)?;
        if needed > grads.size() {
            return Err(Error::LayoutExceedsBuffer {
                needed,
                buffer_size: grads.size(),
            });
        }

        // Windows start at multiples of the storage offset alignment and stay
        // under both the binding limit and the 2^32 elements a u32 can index.
        let align = limits.min_storage_buffer_offset_alignment.max(4) as u64;
        let max_binding = limits.max_storage_buffer_binding_size.min(u32::MAX as u64);
        let window_bytes = max_binding / align * align;
        too_large("storage offset alignment", align, max_binding)?;
        let plan = plan(layout, CHUNK_ELEMENTS, window_bytes / 4)?;
        let chunk_count = plan.chunks.len() as u64;
        too_large(
            "chunk table bytes",
            chunk_count * size_of::<Chunk>() as u64,
            max_binding,
        )?;
        too_large(
            "partials bytes",
            chunk_count * size_of::<Partial>() as u64,
            max_binding,
        )?;

        let busiest = plan
            .windows
            .iter()
            .map(|w| w.chunk_end - w.chunk_begin)
            .max()
            .unwrap_or(1);
        let workgroups = busiest.clamp(
            1,
            MAX_WORKGROUPS.min(limits.max_compute_workgroups_per_dimension),
        );

        let uniform_stride = align_up(
            size_of::<ClipConfig>().max(size_of::<WindowInfo>()) as u64,
            limits.min_uniform_buffer_offset_alignment as u64,
        );
        let window_records = plan.windows.len().max(1) as u64;
        let config_base = window_records * uniform_stride;
        let mut uniform_bytes =
            vec![0u8; ((window_records + CONFIG_SLOTS) * uniform_stride) as usize];
        let infos = plan.windows.iter().map(|w| WindowInfo {
            chunk_begin: w.chunk_begin,
            chunk_end: w.chunk_end,
            chunk_count: chunk_count as u32,
            workgroups,
        });
        let infos: Vec<WindowInfo> = if plan.windows.is_empty() {
            vec![WindowInfo {
                workgroups,
                ..Default::default()
            }]
        } else {
            infos.collect()
        };
        for (k, info) in infos.iter().enumerate() {
            let at = k * uniform_stride as usize;
            uniform_bytes[at..at + size_of::<WindowInfo>()]
                .copy_from_slice(bytemuck::bytes_of(info));
        }

        let catch = Catch::begin(device);
        let storage = wgpu::BufferUsages::STORAGE;
        // Empty tables still need a non-empty binding.
        let chunk_bytes: Vec<u8> = if plan.chunks.is_empty() {
            bytemuck::bytes_of(&Chunk::default()).to_vec()
        } else {
            bytemuck::cast_slice(&plan.chunks).to_vec()
        };
        let chunks = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("gradclip chunk table"),
            contents: &chunk_bytes,
            usage: storage,
        });
        let partials = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip partials"),
            size: chunk_count.max(1) * size_of::<Partial>() as u64,
            usage: storage,
            mapped_at_creation: false,
        });
        let state = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip clip state"),
            size: size_of::<ClipState>() as u64,
            usage: storage | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
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
                .map(|w| (grads, w.first_element * 4, w.elements * 4))
                .collect(),
        };
        let buffer_entry = |binding, buffer, offset, size: usize| wgpu::BindGroupEntry {
            binding,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset,
                size: wgpu::BufferSize::new(size as u64),
            }),
        };
        let bind_groups = grad_ranges
            .iter()
            .enumerate()
            .map(|(k, &(buffer, offset, size))| {
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&format!("gradclip bind group, window {k}")),
                    layout: &inner.bind_group_layout,
                    entries: &[
                        buffer_entry(0, buffer, offset, size as usize),
                        wgpu::BindGroupEntry {
                            binding: 1,
                            resource: chunks.as_entire_binding(),
                        },
                        wgpu::BindGroupEntry {
                            binding: 2,
                            resource: partials.as_entire_binding(),
                        },
                        wgpu::BindGroupEntry {
                            binding: 3,
                            resource: state.as_entire_binding(),
                        },
                        buffer_entry(
                            4,
                            &uniforms,
                            k as u64 * uniform_stride,
                            size_of::<WindowInfo>(),
                        ),
                        buffer_entry(5, &uniforms, config_base, size_of::<ClipConfig>()),
                    ],
                })
            })
            .collect();
        let reports = ReportRing::new(device);
        catch.end()?;

        Ok(Self {
            layout: layout.clone(),
            windows: plan.windows,
            bind_groups,
            state,
            indirect,
            uniforms,
            uniform_stride,
            config_base,
            workgroups,
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

    /// Number of binding windows the gradients are split into (1 unless the
    /// buffer is larger than the device's storage binding limit).
    pub fn window_count(&self) -> usize {
        self.windows.len().max(1)
    }

    /// Dynamic offset of the uniform slot holding `config`; uploads it the
    /// first time it is seen. Slots are reused round-robin past
    /// `CONFIG_SLOTS` distinct configurations.
    fn config_offset(&self, config: ClipConfig) -> u32 {
        let mut cache = self.configs.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Records a global-norm clip into `encoder`: the reduce pass, the
    /// finalize dispatch and the in-place scale pass, whose workgroup count
    /// finalize sets on the GPU (zero when the coefficient is exactly 1).
    /// Nothing is read back unless [`read_report`](Self::read_report) is awaited.
    ///
    /// Invalid parameters return an error before anything is recorded.
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

    /// `clip_norm`, with the timestamps of `clip_norm_timed` when given.
    fn record_clip_norm(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        timestamps: Option<(&wgpu::QuerySet, u32)>,
    ) -> Result<()> {
        let writes = |begin: u32, end: u32| {
            timestamps.map(|(query_set, first)| wgpu::ComputePassTimestampWrites {
                query_set,
                beginning_of_pass_write_index: Some(first + begin),
                end_of_pass_write_index: Some(first + end),
            })
        };
        let (reduction, config) = clip.to_record()?;
        let offset = self.config_offset(config);
        let pipelines = &self.inner.pipelines;
        let has_elements = !self.windows.is_empty();
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("gradclip reduce + finalize"),
                timestamp_writes: writes(0, 2),
            });
            if has_elements {
                pass.set_pipeline(pipelines.reduce(reduction));
                for bind_group in &self.bind_groups {
                    pass.set_bind_group(0, bind_group, &[offset]);
                    pass.dispatch_workgroups(self.workgroups, 1, 1);
                }
            }
            if let Some((query_set, first)) = timestamps {
                let features = self.inner.device.features();
                if features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
                    pass.write_timestamp(query_set, first + 1);
                }
            }
            pass.set_pipeline(pipelines.finalize(reduction));
            pass.set_bind_group(0, &self.bind_groups[0], &[offset]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        if has_elements {
            // The indirect arguments cannot be read from the state binding
            // itself: a buffer may not be both storage and indirect in one dispatch.
            encoder.copy_buffer_to_buffer(
                &self.state,
                DISPATCH_OFFSET,
                &self.indirect,
                0,
                DISPATCH_SIZE,
            );
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("gradclip scale"),
                timestamp_writes: writes(3, 4),
            });
            pass.set_pipeline(&pipelines.scale);
            for bind_group in &self.bind_groups {
                pass.set_bind_group(0, bind_group, &[offset]);
                pass.dispatch_workgroups_indirect(&self.indirect, 0);
            }
        }
        let step = {
            let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
            *steps += 1;
            *steps
        };
        self.reports
            .record(encoder, &self.state, step, config.error_if_nonfinite != 0);
        Ok(())
    }

    /// Records value clipping: every element clamped to `[min, max]` in
    /// place (PyTorch's `clip_grad_value_(v)` is `min = -v, max = v`). NaN
    /// stays NaN; ±inf become the bounds. Leaves the report alone.
    pub fn clip_value(&self, encoder: &mut wgpu::CommandEncoder, min: f32, max: f32) -> Result<()> {
        let offset = self.config_offset(clamp_record(min, max)?);
        if self.windows.is_empty() {
            return Ok(());
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("gradclip clamp"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&self.inner.pipelines.clamp);
        for bind_group in &self.bind_groups {
            pass.set_bind_group(0, bind_group, &[offset]);
            pass.dispatch_workgroups(self.workgroups, 1, 1);
        }
        Ok(())
    }

    /// The report of the latest `clip_norm` recorded on this set and
    /// submitted. Natively it drives the device until the submitted work is
    /// done; in the browser it waits for the map callback. Further steps can
    /// be recorded and submitted while it is pending, and it never has to be
    /// called. Returns [`Error::NonFinite`] for a clip made with
    /// `error_if_nonfinite` whose norm was NaN or infinite.
    pub async fn read_report(&self) -> Result<ClipReport> {
        self.reports.read(&self.inner.device).await
    }
}
