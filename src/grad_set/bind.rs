//! Binding gradients: the plan table, the scratch buffers and the bind
//! groups of a `GradSet`, made once in `Clipper::bind*`; a rebind remakes
//! what depends on where the gradients are and keeps the rest.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::GradSet;
use crate::clipper::{Clipper, ElementPipelines, Inner};
use crate::dtype::{ElementPath, GradType};
use crate::error::Result;
use crate::gpu_errors::{init_buffer, Catch};
use crate::layout::GradLayout;
use crate::plan::{stats_size, Bound, ByPower, Placed, Placement};
use crate::readback::Reader;
use crate::records::{
    ClipConfig, ClipState, Partial, ScalerConfig, WindowInfo, DISPATCH_SIZE, STATS_HEAD_SIZE,
    STATS_SCALER_OFFSET,
};
use crate::scaler::LossScaler;

/// The loss-scale fields of a fresh `ClipState` for `scaler`.
pub(super) fn initial_state(scaler: &LossScaler) -> ClipState {
    ClipState {
        coefficient: 1.0,
        coef_mant: 1.0,
        loss_scale: scaler.init_scale_value(),
        unscaled_by: 1.0,
        ..ClipState::default()
    }
}

/// Everything that depends on where the gradients are.
#[derive(Debug)]
pub(super) struct Bindings {
    /// One per binding window (one placeholder when there is no element).
    pub bind_groups: Vec<wgpu::BindGroup>,
    /// The same for the scale and clamp passes, without the indirect
    /// arguments (`Inner::stream_bind_group_layout`).
    pub stream_bind_groups: Vec<wgpu::BindGroup>,
    /// The reduce / scale pipelines of each binding window's element path.
    pub window_pipelines: Vec<Arc<ElementPipelines>>,
    /// The distinct element paths of the windows, sorted.
    pub paths: Vec<ElementPath>,
    pub has_elements: bool,
    /// Elements of a flat chunk ([`crate::plan::chunk_elements`]).
    pub chunk_elements: u32,
    /// Grid-stride workgroups over flat chunks (global scale, clamp).
    pub flat_workgroups: u32,
    /// The reduce's grid: one workgroup per flat chunk.
    pub reduce_grid: [u32; 2],
    /// Whether a flat chunk holds more than one segment (a tensor boundary
    /// inside it): the per-tensor reduce has segments to track only then.
    pub shared_chunks: bool,
    /// Whether the reduce pass gives some tensors their results itself
    /// (plan::Plan::fuse).
    pub fused: bool,
    /// Whether some flat chunk of several segments has one outside its
    /// unit run (plan::Plan::segments_outside_units).
    pub segments: bool,
    /// Whether the reduce pass needs its lists of medium and long segments
    /// (plan::Bound::fold_lists).
    pub fold_lists: ByPower,
    /// Whether the per-tensor reduce walks some flat chunk untracked
    /// (plan::Bound::untracked).
    pub untracked: ByPower,
    /// Grid-stride workgroups over segments (the per-tensor scale walk).
    pub tensor_workgroups: u32,
    /// Workgroups of the per-tensor statistics pass.
    pub tensor_stat_workgroups: u32,
    /// Workgroups of the long tensors' statistics pass.
    pub long_stat_workgroups: u32,
    /// The gradient buffers, checked before each clip (mapped or destroyed
    /// buffers would make the caller's submission fail).
    pub buffers: Vec<wgpu::Buffer>,
    /// Where each tensor is, to see whether a rebind changes anything.
    pub placements: Vec<Placement>,
    /// What each bind group binds of the gradients.
    windows: Vec<WindowRange>,
    /// Set for bindings made by a rebind: their plan table and window
    /// records are written by each clip's own commands, so that later
    /// rebinds inside the same windows keep the bind groups.
    pub movable: Option<Movable>,
}

/// What one bind group binds of the gradients: buffer (index into
/// `Bindings::buffers`), element type, byte offset and size.
type WindowRange = (usize, GradType, u64, u64);

/// The plan table and window records of movable bindings, and their bytes
/// for the current places (what each clip copies in before its passes).
#[derive(Debug)]
pub(super) struct Movable {
    pub table: wgpu::Buffer,
    pub records: wgpu::Buffer,
    pub table_bytes: Vec<u8>,
    pub record_bytes: Vec<u8>,
}

impl Bindings {
    /// Whether movable bindings can take the places of `bound` (binding
    /// `windows`, from [`window_ranges`]) by new table bytes alone: the
    /// same windows of the same buffers, a table and a partials scratch
    /// large enough.
    fn fits(
        &self,
        bound: &Bound,
        placed: &Placed<'_>,
        windows: &[WindowRange],
        partials: &wgpu::Buffer,
    ) -> bool {
        let Some(movable) = &self.movable else {
            return false;
        };
        self.has_elements
            && windows.len() == self.windows.len()
            && windows.iter().zip(&self.windows).all(|(a, b)| {
                a.1 == b.1 && a.2 == b.2 && a.3 == b.3 && *placed.buffers[a.0] == self.buffers[b.0]
            })
            && 4 * bound.plan.table_words_len() <= movable.table.size()
            && bound.plan.partials_len() * size_of::<Partial>() as u64 <= partials.size()
    }

    /// Moves bindings that [`fits`](Self::fits) `bound` to its places.
    fn move_to(
        &mut self,
        bound: &Bound,
        placed: &Placed<'_>,
        windows: Vec<WindowRange>,
        uniform_stride: u64,
    ) {
        let movable = self.movable.as_mut().expect("fits() checked it");
        movable.table_bytes = bytemuck::cast_slice(&bound.plan.table_words()).to_vec();
        movable.record_bytes = record_bytes(bound, uniform_stride);
        self.chunk_elements = bound.chunk_elements;
        self.flat_workgroups = bound.flat_workgroups;
        self.reduce_grid = bound.reduce_grid;
        self.shared_chunks = bound.plan.shared_chunks();
        self.fused = bound.plan.fused_below != 0;
        self.segments = bound.plan.segments_outside_units();
        self.fold_lists = bound.fold_lists;
        self.untracked = bound.untracked;
        self.tensor_workgroups = bound.workgroups;
        self.tensor_stat_workgroups = bound.tensor_stat_workgroups;
        self.long_stat_workgroups = bound.long_stat_workgroups;
        self.buffers = placed.buffers.iter().map(|b| (*b).clone()).collect();
        self.placements = placed.placements.clone();
        self.windows = windows;
    }

    fn same_places(&self, placed: &Placed<'_>) -> bool {
        self.placements.len() == placed.placements.len()
            && self
                .placements
                .iter()
                .zip(&placed.placements)
                .all(|(a, b)| {
                    a.byte_offset == b.byte_offset
                        && a.dtype == b.dtype
                        && self.buffers[a.buffer] == *placed.buffers[b.buffer]
                })
    }
}

impl Clipper {
    /// Binds a flat gradient buffer laid out by `layout` (tensors packed from
    /// byte 0): creates the chunk table, scratch buffers and bind groups
    /// once, for every later clip on it.
    ///
    /// The buffer needs `STORAGE` usage and at least `4 * layout.total_elements()` bytes.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let layout = gradclip::GradLayout::from_sizes(&[784 * 128, 128])?;
    /// let grads = device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("grads"),
    ///     size: 4 * layout.total_elements(),
    ///     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
    ///     mapped_at_creation: false,
    /// });
    /// let set = clipper.bind(&grads, &layout)?;
    /// assert_eq!(set.window_count(), 1);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind(&self, grads: &wgpu::Buffer, layout: &GradLayout) -> Result<GradSet> {
        self.bind_as(grads, layout, GradType::F32)
    }

    /// Binds a flat gradient buffer of `dtype` elements: tensor `i` is at
    /// elements [`layout.packed_range(i, dtype)`](GradLayout::packed_range)
    /// — back to back for f32; for f16 and bf16 each tensor starts at an
    /// even element (an odd-sized tensor is followed by one padding element,
    /// which no pass changes), so that no 32-bit word holds two tensors.
    ///
    /// The buffer needs `STORAGE` usage and at least
    /// `dtype.bytes() * layout.packed_elements(dtype)` bytes.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let layout = gradclip::GradLayout::from_sizes(&[3, 2])?;
    /// // bf16 bits of [3, 0, 0 | pad | 4, 0]: tensor 1 starts at element 4.
    /// let bits: [u16; 6] = [0x4040, 0, 0, 0, 0x4080, 0];
    /// let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: Some("bf16 grads"), contents: bytemuck::cast_slice(&bits),
    ///     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind_as(&grads, &layout, gradclip::GradType::Bf16)?;
    /// assert_eq!(set.element_paths(), [gradclip::ElementPath::Bf16Packed]);
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.clip_norm(&mut encoder, &gradclip::ClipNorm::new(1.0))?;
    /// queue.submit([encoder.finish()]);
    /// assert_eq!(set.read_report().await?.total_norm, 5.0);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind_as(
        &self,
        grads: &wgpu::Buffer,
        layout: &GradLayout,
        dtype: GradType,
    ) -> Result<GradSet> {
        let placed = Placed::packed(layout, grads, dtype, &self.inner.device.limits())?;
        GradSet::new(self.inner.clone(), layout, &placed)
    }

    /// Binds gradients that live anywhere: tensor `i` of `layout` is the
    /// `f32` range `ranges[i]` (any buffer with `STORAGE` usage, a 4-byte
    /// aligned offset, and a size of `4 * elements` bytes, or `None` for the
    /// rest of the buffer), as frameworks that sub-allocate pooled buffers
    /// lay them out. One clip covers them all, with one dispatch per binding
    /// window (a stretch of one buffer within the device's storage binding
    /// limit) whatever the number of tensors. Overlapping ranges are an error.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let pool = |size| device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("pooled"), size, usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false });
    /// let (pool_a, pool_b) = (pool(1 << 20), pool(1 << 16));
    /// let layout = gradclip::GradLayout::from_named(&[("w", 1000), ("b", 10)])?;
    /// let set = clipper.bind_ranges(&layout, &[
    ///     wgpu::BufferBinding { buffer: &pool_a, offset: 4096, size: wgpu::BufferSize::new(4000) },
    ///     wgpu::BufferBinding { buffer: &pool_b, offset: 12, size: wgpu::BufferSize::new(40) },
    /// ])?;
    /// assert_eq!(set.window_count(), 2);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind_ranges(
        &self,
        layout: &GradLayout,
        ranges: &[wgpu::BufferBinding<'_>],
    ) -> Result<GradSet> {
        let typed: Vec<(wgpu::BufferBinding<'_>, GradType)> =
            ranges.iter().map(|r| (r.clone(), GradType::F32)).collect();
        self.bind_ranges_as(layout, &typed)
    }

    /// [`bind_ranges`](Self::bind_ranges) with an element type per range:
    /// one clip, one global norm over f32, f16 and bf16 tensors together
    /// (an f32 master-gradient buffer and a bf16 buffer, as FusedLAMB
    /// clips them). A range of `n` elements of `dtype` holds
    /// `n * dtype.bytes()` bytes at a 4-byte aligned offset (for 16-bit
    /// types: an even element, so that no 32-bit word holds two tensors);
    /// a 16-bit range with an odd `n` needs its last 4-byte word inside the
    /// buffer, and the half of it past the range keeps its bits.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// use gradclip::GradType;
    /// let buffer = |bytes: &[u8]| device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: Some("grads"), contents: bytes, usage: wgpu::BufferUsages::STORAGE });
    /// let master = buffer(bytemuck::cast_slice(&[3.0f32]));
    /// let half = buffer(bytemuck::cast_slice(&[0x4080u16, 0])); // bf16 [4, pad]
    /// let layout = gradclip::GradLayout::from_named(&[("w", 1), ("b", 1)])?;
    /// let set = clipper.bind_ranges_as(&layout, &[
    ///     (master.as_entire_buffer_binding(), GradType::F32),
    ///     (wgpu::BufferBinding { buffer: &half, offset: 0, size: wgpu::BufferSize::new(2) }, GradType::Bf16),
    /// ])?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.record_norm(&mut encoder, &gradclip::ClipNorm::new(1.0))?;
    /// queue.submit([encoder.finish()]);
    /// assert_eq!(set.read_report().await?.total_norm, 5.0);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind_ranges_as(
        &self,
        layout: &GradLayout,
        ranges: &[(wgpu::BufferBinding<'_>, GradType)],
    ) -> Result<GradSet> {
        let placed = Placed::ranges(layout, ranges)?;
        GradSet::new(self.inner.clone(), layout, &placed)
    }
}

/// The scratch a set keeps across rebinds.
struct Scratch<'a> {
    partials: &'a wgpu::Buffer,
    stats: &'a wgpu::Buffer,
    config: &'a wgpu::Buffer,
    indirect: &'a wgpu::Buffer,
}

fn partials_buffer(device: &wgpu::Device, len: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("gradclip partials"),
        size: len.max(1) * size_of::<Partial>() as u64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}

/// Entries for a movable binding's table or scratch that `needed` entries
/// fill: a quarter and `slack` more, for places that need a few more chunks
/// than these, within the `most` a binding holds (never below `needed`,
/// which the plan checked against the limit).
fn with_room(needed: u64, slack: u64, most: u64) -> u64 {
    (needed + needed / 4 + slack).min(most).max(needed)
}

/// Bytes between window records in the uniform buffer.
fn uniform_stride(device: &wgpu::Device) -> u64 {
    (size_of::<WindowInfo>() as u64)
        .next_multiple_of(device.limits().min_uniform_buffer_offset_alignment as u64)
}

/// The window records of `bound`, one per `uniform_stride` bytes (one
/// record when there is no element to bind).
fn record_bytes(bound: &Bound, uniform_stride: u64) -> Vec<u8> {
    let plan = &bound.plan;
    let chunk_count = plan.chunks.len() as u32;
    let split_count = plan.split_count();
    let long_count = plan.long.len() as u32;
    let info = |w: &crate::plan::Window| WindowInfo {
        chunk_begin: w.chunk_begin,
        chunk_end: w.chunk_end,
        chunk_count,
        workgroups: bound.workgroups,
        tensor_count: plan.tensor_chunks.len() as u32,
        flat_begin: chunk_count + w.flat_begin,
        flat_end: chunk_count + w.flat_end,
        flat_count: plan.flat.len() as u32,
        flat_workgroups: bound.flat_workgroups,
        ranges_at: plan.ranges_at(),
        gaps_at: plan.gaps_at(),
        split_count,
        units_at: plan.units_at(),
        long_count,
    };
    let empty = WindowInfo {
        tensor_count: plan.tensor_chunks.len() as u32,
        ranges_at: plan.ranges_at(),
        gaps_at: plan.gaps_at(),
        split_count,
        units_at: plan.units_at(),
        long_count,
        ..WindowInfo::default()
    };
    let infos: Vec<WindowInfo> = if plan.windows.is_empty() {
        vec![empty]
    } else {
        plan.windows.iter().map(info).collect()
    };
    let mut bytes = vec![0u8; infos.len() * uniform_stride as usize];
    for (k, record) in infos.iter().enumerate() {
        let at = k * uniform_stride as usize;
        bytes[at..at + size_of::<WindowInfo>()].copy_from_slice(bytemuck::bytes_of(record));
    }
    bytes
}

/// What each window binds: its whole grid cell, up to the end of the
/// buffer (never less than its tensors reach), so that tensors moving
/// inside the cell need no new bind group; rounded up to a whole number of
/// 16-byte quads where the buffer has the bytes, so that f32 windows take
/// the vec4 path ([`ElementPath::F32`]).
fn window_ranges(bound: &Bound, placed: &Placed<'_>) -> Vec<WindowRange> {
    bound
        .plan
        .windows
        .iter()
        .map(|w| {
            let size = placed.buffers[w.buffer].size();
            let rest = size.saturating_sub(w.byte_offset) / 4 * 4;
            let bytes = rest.min(bound.window_bytes).max(w.bytes);
            let quads = bytes.next_multiple_of(16);
            let bytes = if w.byte_offset + quads <= size && quads <= bound.window_bytes {
                quads
            } else {
                bytes
            };
            (w.buffer, w.dtype, w.byte_offset, bytes)
        })
        .collect()
}

/// The plan table, the window records and the bind groups of `bound`,
/// binding `windows` (its [`window_ranges`]); `movable` bindings get their
/// table and records with room to spare, written by each clip instead of
/// once here.
fn bindings(
    inner: &Inner,
    bound: &Bound,
    placed: &Placed<'_>,
    windows: Vec<WindowRange>,
    scratch: Scratch<'_>,
    movable: bool,
) -> Result<Bindings> {
    let device = &inner.device;
    for buffer in &placed.buffers {
        inner.check_owns(buffer, "gradient buffer")?;
    }
    let plan = &bound.plan;
    let uniform_stride = uniform_stride(device);
    let window_paths: Vec<ElementPath> = windows
        .iter()
        .map(|&(_, dtype, _, bytes)| inner.path_of(dtype, bytes))
        .collect();
    let window_pipelines = window_paths
        .iter()
        .map(|&path| inner.element_pipelines(path))
        .collect::<Result<Vec<_>>>()?;
    let mut paths = window_paths;
    paths.sort();
    paths.dedup();
    let uniform_bytes = record_bytes(bound, uniform_stride);
    let table_words = plan.table_words();

    let catch = Catch::begin(device);
    let (table, uniforms) = if movable {
        let most = device.limits().max_storage_buffer_binding_size / 4;
        let table_size = 4 * with_room(table_words.len() as u64, 64, most);
        let table = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip plan table (moving gradients)"),
            size: table_size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let uniforms = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip window records (moving gradients)"),
            size: uniform_bytes.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        (table, uniforms)
    } else {
        let table = init_buffer(
            device,
            "gradclip plan table",
            bytemuck::cast_slice(&table_words),
            wgpu::BufferUsages::STORAGE,
        )?;
        let uniforms = init_buffer(
            device,
            "gradclip window records",
            &uniform_bytes,
            wgpu::BufferUsages::UNIFORM,
        )?;
        (table, uniforms)
    };
    let placeholder = plan.windows.is_empty().then(|| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip empty gradients"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    });
    let grad_ranges: Vec<(&wgpu::Buffer, u64, u64)> = match &placeholder {
        Some(buffer) => vec![(buffer, 0, 16)],
        None => windows
            .iter()
            .map(|&(buffer, _, offset, bytes)| (placed.buffers[buffer], offset, bytes))
            .collect(),
    };
    fn entry(
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
    let (bind_groups, stream_bind_groups) = grad_ranges
        .iter()
        .enumerate()
        .map(|(k, &(buffer, offset, size))| {
            let entries = [
                entry(0, buffer, offset, size),
                entry(1, &table, 0, table.size()),
                entry(2, scratch.partials, 0, scratch.partials.size()),
                entry(3, scratch.stats, 0, scratch.stats.size()),
                entry(
                    4,
                    &uniforms,
                    k as u64 * uniform_stride,
                    size_of::<WindowInfo>() as u64,
                ),
                entry(5, scratch.config, 0, scratch.config.size()),
                entry(6, scratch.indirect, 0, DISPATCH_SIZE),
            ];
            let full = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&format!("gradclip bind group, window {k}")),
                layout: &inner.bind_group_layout,
                entries: &entries,
            });
            let stream = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&format!("gradclip stream bind group, window {k}")),
                layout: &inner.stream_bind_group_layout,
                entries: &entries[..6],
            });
            (full, stream)
        })
        .unzip();
    catch.end()?;
    Ok(Bindings {
        bind_groups,
        stream_bind_groups,
        window_pipelines,
        paths,
        has_elements: !plan.windows.is_empty(),
        chunk_elements: bound.chunk_elements,
        flat_workgroups: bound.flat_workgroups,
        reduce_grid: bound.reduce_grid,
        shared_chunks: bound.plan.shared_chunks(),
        fused: bound.plan.fused_below != 0,
        segments: bound.plan.segments_outside_units(),
        fold_lists: bound.fold_lists,
        untracked: bound.untracked,
        tensor_workgroups: bound.workgroups,
        tensor_stat_workgroups: bound.tensor_stat_workgroups,
        long_stat_workgroups: bound.long_stat_workgroups,
        buffers: placed.buffers.iter().map(|b| (*b).clone()).collect(),
        placements: placed.placements.clone(),
        windows,
        movable: movable.then(|| Movable {
            table,
            records: uniforms,
            table_bytes: bytemuck::cast_slice(&table_words).to_vec(),
            record_bytes: uniform_bytes,
        }),
    })
}

impl GradSet {
    /// `placed` says where each tensor of `layout` lives (checked by the caller).
    pub(crate) fn new(inner: Arc<Inner>, layout: &GradLayout, placed: &Placed<'_>) -> Result<Self> {
        let device = &inner.device;
        let bound = Bound::new(
            layout,
            placed,
            &device.limits(),
            inner.workgroup_size,
            inner.chunk_elements,
            inner.team,
            inner.tensors_per_invocation,
        )?;

        // The loss scale starts as GradScaler's default; set_loss_scaler changes it.
        let scaler = LossScaler::new();
        let mut head = vec![0u8; STATS_HEAD_SIZE as usize];
        head[..size_of::<ClipState>()].copy_from_slice(bytemuck::bytes_of(&initial_state(&scaler)));
        let at = STATS_SCALER_OFFSET as usize;
        head[at..at + size_of::<ScalerConfig>()]
            .copy_from_slice(bytemuck::bytes_of(&scaler.config()));

        let catch = Catch::begin(device);
        let stats = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip stats"),
            size: stats_size(layout.len()),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        stats
            .slice(..STATS_HEAD_SIZE)
            .get_mapped_range_mut()
            .map_err(|e| crate::Error::DeviceLost(e.to_string()))?
            .copy_from_slice(&head);
        stats.unmap();
        let partials = partials_buffer(device, bound.plan.partials_len());
        let indirect = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip scale dispatch"),
            size: DISPATCH_SIZE,
            usage: wgpu::BufferUsages::INDIRECT
                | wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let config = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip clip config"),
            size: size_of::<ClipConfig>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        catch.end()?;
        let scratch = Scratch {
            partials: &partials,
            stats: &stats,
            config: &config,
            indirect: &indirect,
        };
        let windows = window_ranges(&bound, placed);
        let bound = bindings(&inner, &bound, placed, windows, scratch, false)?;
        Ok(Self {
            reader: Reader::new(layout.len()),
            layout: layout.clone(),
            bound,
            partials,
            stats,
            indirect,
            config,
            steps: AtomicU64::new(0),
            tensor_steps: AtomicU64::new(0),
            rebinds: 0,
            rebuilds: 0,
            previous: None,
            verified: Default::default(),
            inner,
        })
    }

    /// Moves the set to gradients at new places: tensor `i` of the set's
    /// layout at `ranges[i]`, with the same rules as
    /// [`Clipper::bind_ranges_as`]. Returns `Ok(false)` and does nothing when
    /// every tensor is where it was (same buffer, offset and type), which is
    /// what a framework's memory pool usually hands back step after step.
    ///
    /// Otherwise the set plans the new places (host work in the number of
    /// tensors) and, in the common case, makes no GPU object: the first
    /// rebind makes bind groups over whole binding windows of the buffers
    /// (a fixed grid of the storage binding limit) with a plan table that
    /// each later clip copies in with its own commands, so tensors that move
    /// inside the same buffers keep them. New bind groups are built
    /// ([`rebuild_count`](GradSet::rebuild_count) grows) only when the
    /// windows change (other buffers, a window's element type) or the new
    /// places need more chunks than the table and scratch hold; places that
    /// match the bindings kept from before the latest rebuild switch back to
    /// them. The stats (loss scale, report log, step count), the clip
    /// config, the pipelines and the readback buffers are always kept. Clips
    /// recorded before a rebind keep the places they were recorded with,
    /// whatever order their encoders are submitted in. On an error the set
    /// is left as it was.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// use gradclip::GradType;
    /// let pool = device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("pool"), size: 4096, usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false });
    /// let at = |offset| (wgpu::BufferBinding { buffer: &pool, offset, size: wgpu::BufferSize::new(40) }, GradType::F32);
    /// let layout = gradclip::GradLayout::from_sizes(&[10])?;
    /// let mut set = clipper.bind_ranges_as(&layout, &[at(0)])?;
    /// assert!(!set.rebind_ranges(&[at(0)])?); // unchanged: nothing done
    /// assert!(set.rebind_ranges(&[at(256)])?); // builds bindings that can move
    /// assert!(set.rebind_ranges(&[at(512)])?); // moves them: nothing built
    /// assert!(set.rebind_ranges(&[at(0)])?); // the first places: their bindings were kept
    /// assert_eq!((set.rebind_count(), set.rebuild_count()), (3, 1));
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn rebind_ranges(
        &mut self,
        ranges: &[(wgpu::BufferBinding<'_>, GradType)],
    ) -> Result<bool> {
        let placed = Placed::ranges(&self.layout, ranges)?;
        if self.bound.same_places(&placed) {
            return Ok(false);
        }
        // Bindings made for exactly these places need no upload per clip:
        // prefer them to moving the current ones.
        let back = self
            .previous
            .as_ref()
            .is_some_and(|(previous, _)| previous.same_places(&placed));
        let bound = Bound::new(
            &self.layout,
            &placed,
            &self.inner.device.limits(),
            self.inner.workgroup_size,
            self.inner.chunk_elements,
            self.inner.team,
            self.inner.tensors_per_invocation,
        )?;
        let stride = uniform_stride(&self.inner.device);
        let windows = window_ranges(&bound, &placed);
        if !back && self.bound.fits(&bound, &placed, &windows, &self.partials) {
            self.bound.move_to(&bound, &placed, windows, stride);
            self.rebinds += 1;
            return Ok(true);
        }
        if let Some((mut previous, partials)) = self.previous.take() {
            if back || previous.fits(&bound, &placed, &windows, &partials) {
                if !back {
                    previous.move_to(&bound, &placed, windows, stride);
                }
                self.switch_to(previous, partials);
                return Ok(true);
            }
            self.previous = Some((previous, partials));
        }
        let needed = bound.plan.partials_len() * size_of::<Partial>() as u64;
        let partials = if needed > self.partials.size() {
            log::info!("gradclip: rebind grows the partials scratch to {needed} bytes");
            let most = self.inner.device.limits().max_storage_buffer_binding_size
                / size_of::<Partial>() as u64;
            let len = with_room(bound.plan.partials_len(), 16, most);
            partials_buffer(&self.inner.device, len)
        } else {
            self.partials.clone()
        };
        let scratch = Scratch {
            partials: &partials,
            stats: &self.stats,
            config: &self.config,
            indirect: &self.indirect,
        };
        let bound = bindings(&self.inner, &bound, &placed, windows, scratch, true)?;
        self.switch_to(bound, partials);
        self.rebuilds += 1;
        Ok(true)
    }

    /// Makes `bound` (with its partials scratch) the set's bindings, and
    /// keeps the current ones as the previous; counts a rebind.
    fn switch_to(&mut self, bound: Bindings, partials: wgpu::Buffer) {
        let current = std::mem::replace(&mut self.bound, bound);
        let scratch = std::mem::replace(&mut self.partials, partials);
        self.previous = Some((current, scratch));
        self.rebinds += 1;
    }
}
