//! Binding gradients: the chunk plan, the scratch buffers and the bind
//! groups of a `GradSet`, all made once, in `Clipper::bind*`.

use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use super::encode::ConfigCache;
use super::{GradSet, CHUNK_ELEMENTS, CONFIG_SLOTS, MAX_WORKGROUPS};
use crate::clipper::Inner;
use crate::dtype::{ElementPath, GradType};
use crate::error::{Error, Result};
use crate::gpu_errors::Catch;
use crate::layout::{plan, GradLayout, Placement, Window};
use crate::records::{
    Chunk, ClipConfig, ClipState, Partial, TensorStat, WindowInfo, DISPATCH_SIZE, STATS_HEAD_SIZE,
    STATS_SCALER_OFFSET,
};
use crate::report::ReportRing;
use crate::scaler::LossScaler;

fn align_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

pub(super) fn too_large(what: &'static str, needed: u64, limit: u64) -> Result<()> {
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
pub(super) fn initial_state(scaler: &LossScaler) -> ClipState {
    ClipState {
        coefficient: 1.0,
        loss_scale: scaler.init_scale_value(),
        unscaled_by: 1.0,
        ..ClipState::default()
    }
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
}
