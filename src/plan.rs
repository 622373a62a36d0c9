//! Planning the passes over a layout: where each tensor lives (checked
//! against the buffers and the device), the binding windows, the chunk
//! tables, and the limits they must fit. Everything a bind or a rebind
//! validates is here, before anything is allocated for it.

use crate::dtype::GradType;
use crate::error::{Error, Result};
use crate::layout::GradLayout;
use crate::records::{Chunk, Partial, TensorStat, STATS_HEAD_SIZE};
use crate::shaders::{self, MIN_CHUNK_ELEMENTS};

/// Flat chunks a set of a CPU adapter keeps, if it has the elements, when
/// picking its chunk length: each chunk is one workgroup's work in the
/// reduce, so fewer would leave cores idle, and the per-tensor work of a
/// chunk with many segments lands on one workgroup.
const MIN_CHUNKS: u64 = 64;

/// The flat chunk length of a layout of `total` elements on a device whose
/// longest is `longest`: halved from it down to [`MIN_CHUNK_ELEMENTS`]
/// while the layout would have fewer than [`MIN_CHUNKS`] chunks.
pub(crate) fn chunk_elements(total: u64, longest: u32) -> u32 {
    let mut chunk = longest.max(MIN_CHUNK_ELEMENTS);
    while chunk > MIN_CHUNK_ELEMENTS && total / (chunk as u64) < MIN_CHUNKS {
        chunk /= 2;
    }
    chunk
}

/// Upper bound on the workgroups of a grid-stride dispatch.
const MAX_WORKGROUPS: u32 = 2048;

/// A dispatch of one workgroup per item, `count` items, as an `[x, y]`
/// grid within the per-dimension limit `max_dim`: as few rows as the limit
/// allows, and the items spread evenly over them, so that at most `y - 1`
/// workgroups have no item. Workgroup `(i, j)` takes item `i + j x`.
pub(crate) fn grid(count: u32, max_dim: u32) -> Result<[u32; 2]> {
    let count = count.max(1);
    let rows = count.div_ceil(max_dim.max(1));
    too_large(
        "workgroup rows of a one-per-chunk dispatch",
        rows as u64,
        max_dim as u64,
    )?;
    Ok([count.div_ceil(rows), rows])
}

pub(crate) fn too_large(what: &'static str, needed: u64, limit: u64) -> Result<()> {
    if needed > limit {
        return Err(Error::TooLarge {
            what,
            needed,
            limit,
        });
    }
    Ok(())
}

pub(crate) fn require_usage(buffer: &wgpu::Buffer, usage: wgpu::BufferUsages) -> Result<()> {
    if !buffer.usage().contains(usage) {
        return Err(Error::MissingUsage {
            missing: usage - buffer.usage(),
        });
    }
    Ok(())
}

/// Where a buffer stands for recording work on it. wgpu 30 has no
/// `Buffer::map_state`; asking for a mapped range tells: "not mapped" is the
/// one answer that allows GPU work (a `map_async` still pending looks the
/// same, and cannot be seen).
pub(crate) fn check_recordable(buffer: &wgpu::Buffer, what: &'static str) -> Result<()> {
    if buffer.size() < 4 {
        return Ok(()); // too small for any layout; the size checks say so
    }
    // The first word: a mappable range of any buffer of 4 bytes or more.
    match buffer.slice(..4).get_mapped_range() {
        Ok(_view) => Err(Error::BufferMapped { what }),
        Err(e) => {
            let message = e.to_string();
            if message.contains("destroyed") {
                Err(Error::BufferDestroyed { what })
            } else if message.contains("not mapped") || cfg!(target_arch = "wasm32") {
                // In the browser every refusal reads alike; a destroyed
                // buffer then fails the submission, which makes no report.
                Ok(())
            } else if message.contains("overlap") || message.contains("mapped") {
                // Mapped, with a view of the user's still alive.
                Err(Error::BufferMapped { what })
            } else {
                Ok(()) // anything else is for wgpu's own validation
            }
        }
    }
}

/// Where one tensor lives: which of the bound buffers, at which byte offset,
/// in which element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    pub buffer: usize,
    pub byte_offset: u64,
    pub dtype: GradType,
}

/// The buffers of a bind and where each tensor of the layout lives in them,
/// checked: usages, alignment, sizes and the device's buffer limit.
#[derive(Debug)]
pub(crate) struct Placed<'a> {
    /// Distinct buffers, in order of first use.
    pub buffers: Vec<&'a wgpu::Buffer>,
    pub placements: Vec<Placement>,
}

impl<'a> Placed<'a> {
    /// The layout packed from byte 0 of one buffer of `dtype` ([`GradLayout::packed_range`]).
    pub fn packed(
        layout: &GradLayout,
        buffer: &'a wgpu::Buffer,
        dtype: GradType,
        limits: &wgpu::Limits,
    ) -> Result<Self> {
        require_usage(buffer, wgpu::BufferUsages::STORAGE)?;
        check_recordable(buffer, "gradient buffer")?;
        let needed = layout
            .packed_elements(dtype)
            .checked_mul(dtype.bytes())
            .ok_or(Error::LayoutOverflow)?;
        too_large("layout size in bytes", needed, limits.max_buffer_size)?;
        if needed > buffer.size() {
            return Err(Error::LayoutExceedsBuffer {
                needed,
                buffer_size: buffer.size(),
            });
        }
        // Every byte offset is now below the buffer's size: no overflow below.
        let placements = (0..layout.len())
            .map(|t| Placement {
                buffer: 0,
                byte_offset: dtype.bytes() * layout.packed_range(t, dtype).start,
                dtype,
            })
            .collect();
        Ok(Self {
            buffers: vec![buffer],
            placements,
        })
    }

    /// Tensor `i` at `ranges[i]`: any buffer with `STORAGE`, a 4-byte aligned
    /// offset, `elements * dtype.bytes()` bytes (`None`: the rest of the
    /// buffer), and for 16-bit types the last 4-byte word inside the buffer.
    pub fn ranges(
        layout: &GradLayout,
        ranges: &[(wgpu::BufferBinding<'a>, GradType)],
    ) -> Result<Self> {
        if ranges.len() != layout.len() {
            return Err(Error::RangeMismatch {
                tensor: ranges.len().min(layout.len()),
                range_bytes: 0,
                layout_bytes: 0,
            });
        }
        let mut buffers: Vec<&'a wgpu::Buffer> = Vec::new();
        let mut placements = Vec::with_capacity(ranges.len());
        for (tensor, ((range, dtype), elements)) in ranges.iter().zip(layout.sizes()).enumerate() {
            require_usage(range.buffer, wgpu::BufferUsages::STORAGE)?;
            check_recordable(range.buffer, "gradient buffer")?;
            if !range.offset.is_multiple_of(4) {
                return Err(Error::MisalignedTensor {
                    tensor,
                    offset: range.offset,
                });
            }
            let layout_bytes = elements
                .checked_mul(dtype.bytes())
                .ok_or(Error::LayoutOverflow)?;
            let range_bytes = match range.size {
                Some(size) => size.get(),
                None => range.buffer.size().saturating_sub(range.offset),
            };
            if elements > 0 && range_bytes != layout_bytes {
                return Err(Error::RangeMismatch {
                    tensor,
                    range_bytes,
                    layout_bytes,
                });
            }
            // The passes bind and write whole 4-byte words.
            let end = layout_bytes
                .checked_next_multiple_of(4)
                .and_then(|words| range.offset.checked_add(words))
                .ok_or(Error::LayoutOverflow)?;
            if end > range.buffer.size() {
                return Err(Error::LayoutExceedsBuffer {
                    needed: end,
                    buffer_size: range.buffer.size(),
                });
            }
            let buffer = match buffers.iter().position(|b| *b == range.buffer) {
                Some(index) => index,
                None => {
                    buffers.push(range.buffer);
                    buffers.len() - 1
                }
            };
            placements.push(Placement {
                buffer,
                byte_offset: range.offset,
                dtype: *dtype,
            });
        }
        Ok(Self {
            buffers,
            placements,
        })
    }
}

/// One binding window: a range of one gradient buffer bound on its own,
/// because a storage binding is capped (128 MiB by default) and gradients
/// may be spread over several buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub buffer: usize,
    /// Every tensor of a window has this element type.
    pub dtype: GradType,
    /// Aligned to the device's storage offset alignment.
    pub byte_offset: u64,
    /// A multiple of 4 (a 16-bit tensor's odd tail is bound up to the end of its word).
    pub bytes: u64,
    pub chunk_begin: u32,
    pub chunk_end: u32,
    /// This window's range in `Plan::flat`.
    pub flat_begin: u32,
    pub flat_end: u32,
}

/// The chunk tables, the windows, and each tensor's segment range.
///
/// The global norm is always reduced over `flat`, whatever the clip asks
/// for, so that asking for per-tensor results cannot move its bits. The
/// segments refine the flat chunks at tensor boundaries: each lies in one
/// flat chunk and one tensor, and a flat chunk's segments are contiguous in
/// `chunks` (from its `tensor` word, which holds the index of its first
/// segment, to the next flat chunk's), so the reduce pass computes both in
/// one read of each chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Segments: chunks that each belong to one tensor (per-tensor results).
    pub chunks: Vec<Chunk>,
    /// The elements cut without regard to tensor boundaries: adjacent
    /// tensors of a window merge into runs, so that a clip of the global
    /// norm over thousands of small tensors costs what one tensor costs.
    /// Runs never bridge a gap between tensors (foreign data lives there).
    /// `tensor` holds the index of the chunk's first segment.
    pub flat: Vec<Chunk>,
    pub windows: Vec<Window>,
    pub tensor_chunks: Vec<(u32, u32)>,
    /// Tensors shorter than this that are one segment of a flat chunk of
    /// several get their results from the reduce pass; 0 where none does.
    /// Set with `split` by [`fuse`](Self::fuse).
    pub fused_below: u32,
    /// The split list: every tensor that is neither fused nor long, in
    /// order, whose norm and factor one invocation of the statistics pass
    /// folds from its segments' partials (WGSL `split_tensor`). Empty where
    /// no tensor is fused or long: the pass then takes tensor k as its k-th.
    pub split: Vec<u32>,
    /// The long list: every tensor that is not fused and has more partials
    /// than `fuse`'s `long_above`, in order, whose partials a whole
    /// workgroup of the statistics pass folds (WGSL `long_tensor`).
    pub long: Vec<u32>,
    /// Each flat chunk's unit run, as [begin, end) indices of `chunks`
    /// (empty where it has none), where some tensor is fused; set by
    /// [`fuse`](Self::fuse) (see [`unit_run`](Self::unit_run)).
    pub units: Vec<(u32, u32)>,
}

/// Cuts a window's pieces (each one tensor's elements, in increasing
/// `start` order) into flat chunks: runs of contiguous elements recut at
/// `chunk_elements`; and into segments: the pieces recut at the flat chunks'
/// boundaries. Appends to `flat` and `segments` (all windows' segments).
fn cut_window(
    pieces: &[Chunk],
    chunk_elements: u32,
    flat: &mut Vec<Chunk>,
    segments: &mut Vec<Chunk>,
) -> Result<()> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for c in pieces {
        match runs.last_mut() {
            Some((_, end)) if *end == c.start => *end += c.len,
            _ => runs.push((c.start, c.start + c.len)),
        }
    }
    let mut next = pieces.iter().peekable();
    // How far into the current piece the segments have reached.
    let mut done = 0u32;
    for (mut start, end) in runs {
        while start < end {
            let len = (end - start).min(chunk_elements);
            let first_segment = count_u32("chunk count", segments.len())?;
            flat.push(Chunk {
                start,
                len,
                tensor: first_segment,
            });
            let chunk_end = start + len;
            while let Some(piece) = next.peek() {
                let from = piece.start + done;
                if from >= chunk_end {
                    break;
                }
                let to = (piece.start + piece.len).min(chunk_end);
                segments.push(Chunk {
                    start: from,
                    len: to - from,
                    tensor: piece.tensor,
                });
                if to == piece.start + piece.len {
                    next.next();
                    done = 0;
                } else {
                    done = to - piece.start;
                }
            }
            start = chunk_end;
        }
    }
    Ok(())
}

fn count_u32(what: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::TooLarge {
        what,
        needed: n as u64,
        limit: u32::MAX as u64,
    })
}

/// Cuts the elements of every tensor into flat chunks of at most
/// `chunk_elements` (even) and segments, never across a window; a window
/// is one cell of a fixed grid of `window_bytes` (a multiple of `align`) in
/// its buffer, and holds one element type. Tensors are visited in
/// buffer and offset order so that each window's chunks are contiguous in
/// the tables; each tensor's segments are contiguous too. Overlapping
/// tensors are an error. With tensors at 4-byte aligned offsets (checked by
/// the callers), every chunk and segment of a 16-bit tensor starts at an
/// even element and only a tensor's last segment can have an odd length.
pub(crate) fn plan(
    layout: &GradLayout,
    placements: &[Placement],
    chunk_elements: u32,
    window_bytes: u64,
    align: u64,
) -> Result<Plan> {
    debug_assert!(chunk_elements > 0 && chunk_elements.is_multiple_of(2));
    debug_assert!(window_bytes >= align && window_bytes.is_multiple_of(align));
    debug_assert!(placements.len() == layout.len());
    let sizes: Vec<u64> = layout.sizes().collect();
    let mut order: Vec<usize> = (0..layout.len()).filter(|&t| sizes[t] > 0).collect();
    order.sort_by_key(|&t| (placements[t].buffer, placements[t].byte_offset));
    let bytes_of = |t: usize| placements[t].dtype.bytes() * sizes[t];
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let end_a = placements[a].byte_offset + bytes_of(a);
        if placements[a].buffer == placements[b].buffer && end_a > placements[b].byte_offset {
            return Err(Error::OverlappingTensors {
                first: a,
                second: b,
            });
        }
    }
    count_u32("tensor count", layout.len())?;
    // Each tensor's part of each window, per window.
    let mut windows: Vec<Window> = Vec::new();
    let mut pieces: Vec<Vec<Chunk>> = Vec::new();
    for &t in &order {
        let Placement {
            buffer,
            byte_offset,
            dtype,
        } = placements[t];
        let eb = dtype.bytes();
        let (mut at, end) = (byte_offset, byte_offset + bytes_of(t));
        while at < end {
            // Windows sit on a fixed grid of each buffer, so that gradients
            // that move inside a buffer (a framework's memory pool) keep
            // their windows and a rebind keeps its bind groups.
            let cell = at / window_bytes * window_bytes;
            let fits = windows
                .last()
                .is_some_and(|w| w.buffer == buffer && w.dtype == dtype && w.byte_offset == cell);
            if !fits {
                windows.push(Window {
                    buffer,
                    dtype,
                    byte_offset: cell,
                    bytes: 0,
                    chunk_begin: 0,
                    chunk_end: 0,
                    flat_begin: 0,
                    flat_end: 0,
                });
                pieces.push(Vec::new());
            }
            let w = windows.last_mut().expect("a window was just ensured");
            let elements = ((end - at) / eb).min((w.byte_offset + window_bytes - at) / eb);
            pieces.last_mut().expect("one per window").push(Chunk {
                start: count_u32("chunk start", ((at - w.byte_offset) / eb) as usize)?,
                len: count_u32("chunk length", elements as usize)?,
                tensor: t as u32,
            });
            at += eb * elements;
            w.bytes = (at - w.byte_offset).div_ceil(4) * 4;
        }
    }
    let mut chunks = Vec::new();
    let mut flat = Vec::new();
    for (w, pieces) in windows.iter_mut().zip(&pieces) {
        w.chunk_begin = count_u32("chunk count", chunks.len())?;
        w.flat_begin = count_u32("chunk count", flat.len())?;
        cut_window(pieces, chunk_elements, &mut flat, &mut chunks)?;
        w.chunk_end = count_u32("chunk count", chunks.len())?;
        w.flat_end = count_u32("chunk count", flat.len())?;
    }
    let mut tensor_chunks = vec![(0u32, 0u32); layout.len()];
    let mut i = 0;
    while i < chunks.len() {
        let t = chunks[i].tensor;
        let first = i;
        while i < chunks.len() && chunks[i].tensor == t {
            i += 1;
        }
        tensor_chunks[t as usize] = (first as u32, i as u32);
    }
    Ok(Plan {
        chunks,
        flat,
        windows,
        tensor_chunks,
        fused_below: 0,
        split: Vec::new(),
        long: Vec::new(),
        units: Vec::new(),
    })
}

/// A property of a layout's per-tensor reduce that depends on whether the
/// reduction is a general p, whose tracked walk's slots take two words
/// ([`shaders::slot_words`]), so that fewer of its chunks are tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct ByPower {
    /// For L2, Inf and an integer p.
    pub plain: bool,
    /// For a general p.
    pub general_p: bool,
}

impl ByPower {
    /// The property for each kind of reduction, from `of(general_p)`.
    fn of(of: impl Fn(bool) -> bool) -> Self {
        Self {
            plain: of(false),
            general_p: of(true),
        }
    }

    /// The property for a reduction, a general p or not.
    pub fn get(self, general_p: bool) -> bool {
        if general_p {
            self.general_p
        } else {
            self.plain
        }
    }
}

/// A plan with everything the GPU tables and dispatches need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bound {
    pub plan: Plan,
    /// Elements of a flat chunk ([`chunk_elements`]).
    pub chunk_elements: u32,
    /// The grid the windows sit on (see [`plan`]): each window binds its
    /// cell, `window_bytes` or up to the end of its buffer.
    pub window_bytes: u64,
    /// Grid-stride workgroups over per-tensor chunks, and over flat chunks
    /// (the scale and clamp passes).
    pub workgroups: u32,
    pub flat_workgroups: u32,
    /// The reduce's dispatch: one workgroup per flat chunk of the busiest
    /// window ([`grid`]).
    pub reduce_grid: [u32; 2],
    /// Whether the reduce pass needs its per-segment fold's lists of
    /// medium and long segments (WGSL `FOLD_LISTS`): some flat chunk of
    /// several segments is not tracked ([`shaders::tracks_chunk`]) and
    /// holds a segment of at least `tiny_run` elements (the element-wise
    /// fold takes the shorter ones).
    pub fold_lists: ByPower,
    /// Whether the per-tensor reduce walks some flat chunk untracked
    /// (WGSL `UNTRACKED`): a chunk of one segment, one of several that
    /// [`shaders::tracks_chunk`] declines, or one with a unit run (whose
    /// walk takes the run). Off, every chunk takes the tracked walk, and
    /// the pipeline needs no other.
    pub untracked: ByPower,
    /// Workgroups of the per-tensor statistics pass (invocations striding
    /// over the split tensors, `tensors_per_invocation` each where there
    /// are that many), for workgroups of `workgroup_size` invocations; none
    /// where every tensor is fused or long.
    pub tensor_stat_workgroups: u32,
    /// Workgroups of the long tensors' statistics pass (workgroups striding
    /// over the long list); none where it is empty.
    pub long_stat_workgroups: u32,
}

impl Bound {
    /// Plans `placed` for a device with `limits`: windows start at multiples
    /// of the storage offset alignment and stay under both the binding limit
    /// and the 2^32 elements a u32 can index; the tables must fit a binding.
    pub fn new(
        layout: &GradLayout,
        placed: &Placed<'_>,
        limits: &wgpu::Limits,
        workgroup_size: u32,
        longest_chunk: u32,
        team: u32,
        tensors_per_invocation: u32,
    ) -> Result<Self> {
        let chunk_elements = chunk_elements(layout.total_elements(), longest_chunk);
        let align = (limits.min_storage_buffer_offset_alignment as u64).max(4);
        let max_binding = limits.max_storage_buffer_binding_size.min(u32::MAX as u64) / 4 * 4;
        too_large("storage offset alignment", align, max_binding)?;
        let window_bytes = max_binding / align * align;
        let mut plan = plan(
            layout,
            &placed.placements,
            chunk_elements,
            window_bytes,
            align,
        )?;
        let below = shaders::tiny_run(longest_chunk);
        // A tensor of more partials than a workgroup has invocations is
        // folded by a workgroup, as finalize folds the chunks, not by one
        // invocation: on an H200 one invocation took 0.74-1.1 ms over the
        // 7 629 partials of 2.5 * 10^8 elements, finalize 16-18 us. The bits
        // are the same either way, and tensor_stats' fold (fold.wgsl's
        // fold_short) takes no more than WG partials.
        plan.fuse(below, workgroup_size);
        too_large("plan table bytes", 4 * plan.table_words_len(), max_binding)?;
        too_large(
            "partials bytes",
            plan.partials_len() * size_of::<Partial>() as u64,
            max_binding,
        )?;
        too_large(
            "per-tensor statistics bytes",
            stats_size(layout.len()),
            max_binding,
        )?;
        // The busiest window's segments and flat chunks: the grid-stride
        // passes take that many workgroups within the dispatch limit, the
        // reduce one per flat chunk.
        let most = |count: fn(&Window) -> u32| plan.windows.iter().map(count).max().unwrap_or(1);
        let segments = most(|w| w.chunk_end - w.chunk_begin);
        let flat = most(|w| w.flat_end - w.flat_begin);
        let cap = MAX_WORKGROUPS.min(limits.max_compute_workgroups_per_dimension);
        let tracked = |k: usize, general_p: bool| {
            let (first, end) = plan.flat_segments(k);
            shaders::tracks_chunk(
                (end - first) as u32,
                plan.gap(k),
                workgroup_size,
                team,
                longest_chunk,
                shaders::slot_words(general_p),
            )
        };
        let fold_lists = ByPower::of(|general_p| {
            (0..plan.flat.len()).any(|k| {
                let (first, end) = plan.flat_segments(k);
                end - first > 1
                    && !tracked(k, general_p)
                    && plan.chunks[first..end].iter().any(|c| c.len >= below)
            })
        });
        let untracked = ByPower::of(|general_p| {
            (0..plan.flat.len()).any(|k| !tracked(k, general_p) || plan.has_unit_run(k))
        });
        Ok(Self {
            fold_lists,
            untracked,
            chunk_elements,
            window_bytes,
            workgroups: segments.clamp(1, cap),
            flat_workgroups: flat.clamp(1, cap),
            reduce_grid: grid(flat, limits.max_compute_workgroups_per_dimension)?,
            tensor_stat_workgroups: (plan.split_count() as u64)
                .div_ceil(workgroup_size as u64 * tensors_per_invocation.max(1) as u64)
                .min(cap as u64) as u32,
            long_stat_workgroups: (plan.long.len() as u32).min(cap),
            plan,
        })
    }
}

/// Bytes of the stats buffer for `tensors` tensors (at least one stat, so
/// that the binding is never shorter than the shaders' minimum).
pub(crate) fn stats_size(tensors: usize) -> u64 {
    STATS_HEAD_SIZE + (tensors.max(1) * size_of::<TensorStat>()) as u64
}

impl Plan {
    /// Whether a flat chunk holds more than one segment: every flat chunk
    /// holds one at least.
    pub fn shared_chunks(&self) -> bool {
        self.chunks.len() > self.flat.len()
    }

    /// Partials, indexed like the chunk table: per-tensor chunks, then flat ones.
    pub fn partials_len(&self) -> u64 {
        (self.chunks.len() + self.flat.len()) as u64
    }

    /// Words of the plan table: the chunks, two words per tensor, one per
    /// flat chunk, one per split tensor, two per unit run.
    pub fn table_words_len(&self) -> u64 {
        3 * self.partials_len()
            + 2 * self.tensor_chunks.len() as u64
            + self.flat.len() as u64
            + self.split.len() as u64
            + self.long.len() as u64
            + 2 * self.units.len() as u64
    }

    /// Word index of the per-tensor partial ranges in the table.
    pub fn ranges_at(&self) -> u32 {
        (3 * self.partials_len()) as u32
    }

    /// Word index of the flat chunks' gaps in the table.
    pub fn gaps_at(&self) -> u32 {
        self.ranges_at() + 2 * self.tensor_chunks.len() as u32
    }

    /// Word index of the flat chunks' unit runs in the table (after the
    /// split and long lists).
    pub fn units_at(&self) -> u32 {
        self.gaps_at() + (self.flat.len() + self.split.len() + self.long.len()) as u32
    }

    /// Flat chunk k's gap: the length of its shortest segment that lies
    /// wholly inside it (neither its first nor its last), u32::MAX where it
    /// has none. The reduce pass sizes the rounds of its tracked walk by it
    /// (WGSL `tracked_round`).
    pub fn gap(&self, k: usize) -> u32 {
        let (first, end) = self.flat_segments(k);
        let inner = self
            .chunks
            .get(first + 1..end.saturating_sub(1))
            .unwrap_or(&[]);
        inner.iter().map(|c| c.len).min().unwrap_or(u32::MAX)
    }

    /// Whether each tensor would be fused for `below`: one segment, of
    /// fewer than `below` elements, of a flat chunk of several segments
    /// (the reduce pass folds such a segment by itself, where a tensor's
    /// norm and factor cost little more than its partial; WGSL `is_fused`).
    fn fused_with(&self, below: u32) -> Vec<bool> {
        let mut fused = vec![false; self.tensor_chunks.len()];
        for k in 0..self.flat.len() {
            let (first, end) = self.flat_segments(k);
            if end - first < 2 {
                continue;
            }
            for s in first..end {
                let t = self.chunks[s].tensor as usize;
                if self.tensor_chunks[t] == (s as u32, s as u32 + 1) && self.chunks[s].len < below {
                    fused[t] = true;
                }
            }
        }
        fused
    }

    /// Fuses the tensors [`fused_with`](Self::fused_with) `below` picks, if
    /// any: sets `fused_below` (the `FUSE` override goes with it) and their
    /// unit runs; none fused, neither. Of the others, those of more than
    /// `long_above` partials go to the long list and the rest to the split
    /// list, which is left empty where every tensor would be on it.
    pub fn fuse(&mut self, below: u32, long_above: u32) {
        let fused = self.fused_with(below);
        let any_fused = fused.contains(&true);
        if any_fused {
            self.fused_below = below;
            self.units = (0..self.flat.len())
                .map(|k| self.unit_run(k, &fused))
                .collect();
        } else {
            self.fused_below = 0;
            self.units.clear();
        }
        let long = |t: u32| {
            let (begin, end) = self.tensor_chunks[t as usize];
            end - begin > long_above
        };
        let unfused = (0..fused.len() as u32).filter(|&t| !fused[t as usize]);
        self.long = unfused.clone().filter(|&t| long(t)).collect();
        self.split = if any_fused || !self.long.is_empty() {
            unfused.filter(|&t| !long(t)).collect()
        } else {
            Vec::new()
        };
    }

    /// Flat chunk k's unit run: its longest run of segments that are each
    /// a fused tensor of one element, the elements one after another in
    /// the window and the tensors too, trimmed to whole quads of the
    /// window (at least one), so that the reduce pass reads them a quad at
    /// a time and finds each one's tensor by arithmetic, with no segment
    /// record (WGSL `unit_stats`). The trimmed ends, at most three
    /// elements each, go through the pass's loop over segments, which gives
    /// a one-element tensor the same bits: the run then needs no path for
    /// part of a quad, and the pipelines that have runs compile one copy
    /// fewer of the general path. Empty (at the chunk's first segment)
    /// where there is none.
    fn unit_run(&self, k: usize, fused: &[bool]) -> (u32, u32) {
        let (first, end) = self.flat_segments(k);
        let unit = |s: usize| {
            let c = &self.chunks[s];
            c.len == 1 && fused[c.tensor as usize]
        };
        let follows = |s: usize| {
            let (a, b) = (&self.chunks[s - 1], &self.chunks[s]);
            b.start == a.start + 1 && b.tensor == a.tensor + 1
        };
        // The segments of run [begin, stop) whose elements fill whole
        // quads, as [begin, end) again: empty where none does.
        let whole_quads = |begin: usize, stop: usize| {
            let lo = self.chunks[begin].start as usize;
            let (qlo, qhi) = (lo.next_multiple_of(4), (lo + stop - begin) / 4 * 4);
            let b = begin + (qlo - lo);
            (b, b + qhi.saturating_sub(qlo))
        };
        let mut best = (first, first);
        let mut begin = first;
        for s in first..=end {
            let breaks = s == end || !unit(s) || (s > begin && !follows(s));
            if !breaks {
                continue;
            }
            if s > begin {
                let (b, e) = whole_quads(begin, s);
                if e - b > best.1 - best.0 {
                    best = (b, e);
                }
            }
            begin = if s < end && unit(s) { s } else { s + 1 };
        }
        (best.0 as u32, best.1 as u32)
    }

    /// Whether some flat chunk of several segments has a segment outside
    /// its unit run (WGSL `SEGMENTS`): without one, every such chunk is
    /// all unit run, and the per-tensor reduce needs neither its
    /// per-segment loop nor the tracked walks nor the lists.
    pub fn segments_outside_units(&self) -> bool {
        (0..self.flat.len()).any(|k| {
            let (first, end) = self.flat_segments(k);
            end - first > 1
                && self
                    .units
                    .get(k)
                    .is_none_or(|&(b, e)| (b as usize, e as usize) != (first, end))
        })
    }

    /// Whether flat chunk k has a unit run (WGSL `unit_run`, which the
    /// per-tensor reduce's walk then takes).
    pub fn has_unit_run(&self, k: usize) -> bool {
        self.units.get(k).is_some_and(|&(begin, end)| end > begin)
    }

    /// Flat chunk k's segments, as [begin, end) indices of `chunks`.
    fn flat_segments(&self, k: usize) -> (usize, usize) {
        let first = self.flat[k].tensor as usize;
        let end = self
            .flat
            .get(k + 1)
            .map_or(self.chunks.len(), |c| c.tensor as usize);
        (first, end)
    }

    /// Tensors of the statistics pass's invocations: the split list's, or
    /// every tensor where none is fused or long.
    pub fn split_count(&self) -> u32 {
        if self.fused_below == 0 && self.long.is_empty() {
            self.tensor_chunks.len() as u32
        } else {
            self.split.len() as u32
        }
    }

    /// The plan table the shaders read: per-tensor chunks, flat chunks (three
    /// words each), each tensor's range of partials (its per-tensor
    /// chunks), each flat chunk's gap, then the split list where some
    /// tensor is fused or long, the long list, and then each flat chunk's
    /// unit run. Never empty: a binding cannot be.
    pub fn table_words(&self) -> Vec<u32> {
        let mut words = Vec::with_capacity(self.table_words_len().max(1) as usize);
        for c in self.chunks.iter().chain(&self.flat) {
            words.extend_from_slice(&[c.start, c.len, c.tensor]);
        }
        for &(begin, end) in &self.tensor_chunks {
            words.extend_from_slice(&[begin, end]);
        }
        words.extend((0..self.flat.len()).map(|k| self.gap(k)));
        words.extend(&self.split);
        words.extend(&self.long);
        words.extend(self.units.iter().flat_map(|&(begin, end)| [begin, end]));
        if words.is_empty() {
            words.push(0);
        }
        words
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_every_item_once_within_the_limit() {
        for max_dim in [1u32, 2, 3, 7, 16, 65535] {
            for count in (0u32..=300).chain([65535, 65536, 131071, 1 << 20]) {
                if count.div_ceil(max_dim) > max_dim {
                    assert!(grid(count, max_dim).is_err(), "{count} in {max_dim}");
                    continue;
                }
                let [x, y] = grid(count, max_dim).unwrap();
                assert!(x >= 1 && x <= max_dim && y >= 1 && y <= max_dim);
                let count = count.max(1);
                // Items i + j x for i < x, j < y are 0 .. x y: all of them
                // when x y >= count, and the spare ones fewer than a row.
                assert!(x * y >= count, "{count} in {max_dim}: {x} x {y}");
                assert!(x * y - count < y, "{count} in {max_dim}: {x} x {y}");
                assert_eq!(
                    y,
                    count.div_ceil(max_dim),
                    "as few rows as the limit allows"
                );
            }
        }
    }

    #[test]
    fn chunks_shorten_until_a_layout_makes_enough_of_them() {
        let cpu = 131072;
        // 10^7 elements: 76 chunks of the longest length.
        assert_eq!(chunk_elements(10_000_000, cpu), cpu);
        assert_eq!(chunk_elements(64 * 131072, cpu), cpu);
        assert_eq!(chunk_elements(64 * 131072 - 1, cpu), 65536);
        // 200 000 one-element tensors keep the GPU length (7 chunks).
        assert_eq!(chunk_elements(200_000, cpu), MIN_CHUNK_ELEMENTS);
        assert_eq!(chunk_elements(0, cpu), MIN_CHUNK_ELEMENTS);
        // A GPU's length never changes.
        assert_eq!(
            chunk_elements(1 << 40, MIN_CHUNK_ELEMENTS),
            MIN_CHUNK_ELEMENTS
        );
    }

    #[test]
    fn a_flat_chunks_gap_is_its_shortest_segment_inside_it() {
        // Flat chunks of 64 elements over tensors of 10, 50, 20, 5, 100
        // and 30 (an empty one among them makes no segment): [0, 64) holds
        // 10, 50 and 4 elements, [64, 128) 16, 5 and 43, [128, 192) 57 and
        // 7, [192, 215) 23.
        let layout = GradLayout::from_sizes(&[10, 50, 0, 20, 5, 100, 30]).unwrap();
        let plan = plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
        let gaps: Vec<u32> = (0..plan.flat.len()).map(|k| plan.gap(k)).collect();
        assert_eq!(gaps, [50, 5, u32::MAX, u32::MAX]);
        let words = plan.table_words();
        assert_eq!(words.len() as u64, plan.table_words_len());
        assert_eq!(&words[plan.gaps_at() as usize..], &gaps[..]);
    }

    #[test]
    fn fused_tensors_are_whole_tiny_segments_of_shared_chunks() {
        // The layout above: [0, 64) holds tensors 0 (10) and 1 (50) whole,
        // tensor 3 crosses into [64, 128), which holds tensor 4 (5) whole;
        // tensor 2 is empty, 5 and 6 cross chunk ends.
        let layout = GradLayout::from_sizes(&[10, 50, 0, 20, 5, 100, 30]).unwrap();
        let mut plan = plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
        assert_eq!((plan.fused_below, plan.split_count()), (0, 7));
        assert!(plan.split.is_empty());
        assert_eq!(plan.table_words().len() as u64, plan.table_words_len());
        plan.fuse(11, u32::MAX);
        let fused = plan.fused_with(11);
        assert_eq!(fused, [true, false, false, false, true, false, false]);
        assert_eq!((plan.fused_below, plan.split_count()), (11, 5));
        assert_eq!(plan.split, [1, 2, 3, 5, 6]);
        let words = plan.table_words();
        assert_eq!(words.len() as u64, plan.table_words_len());
        assert_eq!(
            &words[plan.gaps_at() as usize + plan.flat.len()..plan.units_at() as usize],
            &plan.split[..]
        );
        plan.fuse(51, u32::MAX);
        assert_eq!(plan.split, [2, 3, 5, 6]);
        // Nothing below 5 elements: nothing fused, no list.
        plan.fuse(5, u32::MAX);
        assert_eq!((plan.fused_below, plan.split_count()), (0, 7));
        assert!(plan.split.is_empty());
        // A tensor alone in its flat chunk keeps its partial: the reduce
        // pass stores a one-segment chunk's own.
        let layout = GradLayout::from_sizes(&[5]).unwrap();
        let mut alone = super::plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
        alone.fuse(11, u32::MAX);
        assert_eq!((alone.fused_below, alone.split_count()), (0, 1));
    }

    #[test]
    fn long_tensors_leave_the_split_list_for_the_long_list() {
        // Chunks of 64: tensors 3 [60, 80), 5 [85, 185) and 6 [185, 215)
        // cross chunk ends (two segments each), the others are one.
        let layout = GradLayout::from_sizes(&[10, 50, 0, 20, 5, 100, 30]).unwrap();
        let mut plan = plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
        let partials: Vec<u32> = plan.tensor_chunks.iter().map(|&(b, e)| e - b).collect();
        assert_eq!(partials, [1, 1, 0, 2, 1, 2, 2]);
        plan.fuse(11, 1);
        assert_eq!((plan.fused_below, plan.split_count()), (11, 2));
        assert_eq!(
            (&plan.split[..], &plan.long[..]),
            (&[1, 2][..], &[3, 5, 6][..])
        );
        let words = plan.table_words();
        assert_eq!(words.len() as u64, plan.table_words_len());
        let split_at = plan.gaps_at() as usize + plan.flat.len();
        assert_eq!(&words[split_at..split_at + 2], &plan.split[..]);
        assert_eq!(
            &words[split_at + 2..plan.units_at() as usize],
            &plan.long[..]
        );
        // Nothing fused: the split list is still written out, without the
        // long tensors, so that entry k is no longer tensor k.
        plan.fuse(5, 1);
        assert_eq!((plan.fused_below, plan.split_count()), (0, 4));
        assert_eq!(
            (&plan.split[..], &plan.long[..]),
            (&[0, 1, 2, 4][..], &[3, 5, 6][..])
        );
        assert_eq!(plan.table_words().len() as u64, plan.table_words_len());
        // None long, none fused: no list, every tensor the pass's own.
        plan.fuse(5, 2);
        assert_eq!((plan.fused_below, plan.split_count()), (0, 7));
        assert!(plan.split.is_empty() && plan.long.is_empty());
        assert_eq!(plan.table_words().len() as u64, plan.table_words_len());
    }

    #[test]
    fn segments_lie_outside_unit_runs_unless_each_shared_chunk_is_one() {
        let fused = |sizes: &[usize]| {
            let layout = GradLayout::from_sizes(sizes).unwrap();
            let mut plan = plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
            plan.fuse(11, u32::MAX);
            plan
        };
        // One-element tensors only, whole quads: every chunk is all unit run.
        assert!(!fused(&[1; 200]).segments_outside_units());
        // Beside tensors that fill chunks of their own.
        let mut sizes = vec![64, 128];
        sizes.extend([1; 64]);
        sizes.push(64);
        assert!(!fused(&sizes).segments_outside_units());
        // A two-element tensor after them, in the last chunk.
        let mut sizes = vec![1; 200];
        sizes.push(2);
        assert!(fused(&sizes).segments_outside_units());
        // 198 of them: the last chunk's run is trimmed to whole quads.
        assert!(fused(&[1; 198]).segments_outside_units());
        // A run that starts inside a chunk, after a longer tensor.
        let mut sizes = vec![30];
        sizes.extend([1; 98]);
        assert!(fused(&sizes).segments_outside_units());
        // Nothing fused: shared chunks keep their segments.
        let layout = GradLayout::from_sizes(&[1; 200]).unwrap();
        let unfused = plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
        assert!(unfused.segments_outside_units());
        // No shared chunk at all.
        let layout = GradLayout::from_sizes(&[64, 128]).unwrap();
        let alone = plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
        assert!(!alone.segments_outside_units());
    }

    #[test]
    fn a_set_walks_a_chunk_untracked_unless_every_chunk_is_tracked() {
        // A CPU adapter's reduce (256 invocations, teams of one, chunks of
        // up to 131072 elements: 32768 here) tracks a chunk of up to 1281
        // segments (513 for a general p, whose slots take two words) none
        // of whose inner ones is shorter than a block of 16 elements; a
        // GPU's (teams of 8) up to 161 (65) and blocks of 128.
        let untracked = |sizes: &[usize], team: u32| {
            let layout = GradLayout::from_sizes(sizes).unwrap();
            let placed = Placed {
                buffers: Vec::new(),
                placements: packed(&layout),
            };
            let limits = wgpu::Limits::default();
            let b = Bound::new(&layout, &placed, &limits, 256, 131072, team, 32).unwrap();
            assert_eq!(b.chunk_elements, 32768);
            (b.untracked.plain, b.untracked.general_p)
        };
        // 96 tensors of 1024 elements: three chunks of 32 segments each.
        let even = vec![1024; 96];
        assert_eq!(untracked(&even, 1), (false, false));
        assert_eq!(untracked(&even, 8), (false, false));
        // One tensor more, of a chunk and five elements: a chunk of one
        // segment, then one of the last five.
        let mut beside = even.clone();
        beside.push(32773);
        assert_eq!(untracked(&beside, 1), (true, true));
        // Tensors of 40 elements (fused), 819 to a chunk: tracked on the
        // CPU for L2 only, on a GPU neither (shorter than its blocks).
        let short = vec![40; 2457];
        assert_eq!(untracked(&short, 1), (false, true));
        assert_eq!(untracked(&short, 8), (true, true));
        // Tensors of 100 elements, 328 to a chunk, on the CPU: tracked both.
        assert_eq!(untracked(&[100; 983], 1), (false, false));
        // One inner segment shorter than a block.
        let mut narrow = even.clone();
        narrow[40] = 15;
        assert_eq!(untracked(&narrow, 1), (true, true));
        // One-element tensors in a run: a unit run, never tracked.
        let mut units = even.clone();
        units.splice(40..40, [1; 64]);
        assert_eq!(untracked(&units, 1), (true, true));
        // One tensor alone, and no elements at all.
        assert_eq!(untracked(&[100_000], 1), (true, true));
        assert_eq!(untracked(&[0, 0], 1), (false, false));
    }

    #[test]
    fn unit_runs_are_each_chunks_longest_run_of_whole_quads_of_one_element_tensors() {
        // Chunk [0, 64): tensor 0 (5 elements), 1-10 (one each, elements
        // 5-14: whole quads 8-11 only), 11 (5), 12-19 (one each, elements
        // 20-27: two whole quads, so this run wins though it is shorter),
        // 20 (30) and 21 (20, into the next chunk); chunk [64, 128): 22-24
        // (one each, elements 78-80: no whole quad), 25 (empty: tensor 26
        // follows 24's element but not its index), 26-32 (one each,
        // elements 81-87: quad 84-87 only), then 33 (200) to the end.
        let mut sizes = vec![5];
        sizes.extend([1; 10]);
        sizes.push(5);
        sizes.extend([1; 8]);
        sizes.extend([30, 20, 1, 1, 1, 0]);
        sizes.extend([1; 7]);
        sizes.push(200);
        let layout = GradLayout::from_sizes(&sizes).unwrap();
        let mut plan = plan(&layout, &packed(&layout), 64, 1 << 20, 16).unwrap();
        plan.fuse(11, u32::MAX);
        let tensor = |s: u32| plan.chunks[s as usize].tensor;
        let start = |s: u32| plan.chunks[s as usize].start;
        assert_eq!(
            (tensor(plan.units[0].0), tensor(plan.units[0].1 - 1)),
            (12, 19)
        );
        assert_eq!(plan.units[0].1 - plan.units[0].0, 8);
        assert_eq!(
            (tensor(plan.units[1].0), tensor(plan.units[1].1 - 1)),
            (29, 32)
        );
        assert_eq!(plan.units[1].1 - plan.units[1].0, 4);
        for &(begin, end) in &plan.units[..2] {
            assert_eq!((start(begin) % 4, (end - begin) % 4), (0, 0));
        }
        assert_eq!(plan.units.len(), plan.flat.len());
        for (k, &(begin, end)) in plan.units.iter().enumerate().skip(2) {
            assert_eq!(
                (begin, end),
                (plan.flat[k].tensor, plan.flat[k].tensor),
                "chunk {k}"
            );
        }
        let words = plan.table_words();
        assert_eq!(words.len() as u64, plan.table_words_len());
        let at = plan.units_at() as usize;
        assert_eq!(
            words[at..at + 4],
            [
                plan.units[0].0,
                plan.units[0].1,
                plan.units[1].0,
                plan.units[1].1
            ]
        );
        // Fusing only one-element tensors gives the same runs; nothing
        // fused, none.
        let units = plan.units.clone();
        plan.fuse(2, u32::MAX);
        assert_eq!(plan.units, units);
        plan.fuse(1, u32::MAX);
        assert!(plan.units.is_empty());
        assert_eq!(plan.table_words().len() as u64, plan.table_words_len());
    }

    #[test]
    fn tracked_chunks_fit_the_slots_and_a_round() {
        use crate::shaders::{tracks_chunk, CPU_TEAM, GPU_TEAM};
        // CPU adapters: 32 invocations, a team of one each, 16-element
        // blocks; GPUs: 256 invocations in teams of 8, 128-element blocks.
        assert!(tracks_chunk(1505, 16, 32, CPU_TEAM, 131072, 1));
        assert!(!tracks_chunk(1506, 16, 32, CPU_TEAM, 131072, 1));
        assert!(!tracks_chunk(2, 15, 32, CPU_TEAM, 131072, 1));
        assert!(tracks_chunk(161, 128, 256, GPU_TEAM, 32768, 1));
        assert!(!tracks_chunk(162, 128, 256, GPU_TEAM, 32768, 1));
        assert!(!tracks_chunk(2, 127, 256, GPU_TEAM, 32768, 1));
        assert!(tracks_chunk(2, u32::MAX, 256, GPU_TEAM, 32768, 1));
        assert!(!tracks_chunk(1, u32::MAX, 32, CPU_TEAM, 131072, 1));
        // A general p's two-word slots: half the rows.
        assert!(tracks_chunk(737, 16, 32, CPU_TEAM, 131072, 2));
        assert!(!tracks_chunk(738, 16, 32, CPU_TEAM, 131072, 2));
        assert!(tracks_chunk(65, 128, 256, GPU_TEAM, 32768, 2));
        assert!(!tracks_chunk(66, 128, 256, GPU_TEAM, 32768, 2));
    }

    fn packed(layout: &GradLayout) -> Vec<Placement> {
        (0..layout.len())
            .map(|t| Placement {
                buffer: 0,
                byte_offset: 4 * layout.range(t).start,
                dtype: GradType::F32,
            })
            .collect()
    }

    fn packed16(layout: &GradLayout) -> Vec<Placement> {
        (0..layout.len())
            .map(|t| Placement {
                buffer: 0,
                byte_offset: 2 * layout.packed_range(t, GradType::Bf16).start,
                dtype: GradType::Bf16,
            })
            .collect()
    }

    /// Every element of every tensor is covered once, by a chunk of its own tensor.
    fn check_cover(layout: &GradLayout, placements: &[Placement], plan: &Plan, window_bytes: u64) {
        let mut covered: Vec<Vec<u64>> = vec![Vec::new(); layout.len()];
        for w in &plan.windows {
            assert!(w.bytes <= window_bytes);
            assert!(w.bytes.is_multiple_of(4));
            let eb = w.dtype.bytes();
            for c in &plan.chunks[w.chunk_begin as usize..w.chunk_end as usize] {
                assert!(c.len >= 1);
                assert!(eb * (c.start as u64 + c.len as u64) <= w.bytes);
                let byte = w.byte_offset + eb * c.start as u64;
                assert_eq!(w.buffer, placements[c.tensor as usize].buffer);
                assert_eq!(w.dtype, placements[c.tensor as usize].dtype);
                if eb == 2 {
                    // Word ownership: chunks start on words.
                    assert!(c.start.is_multiple_of(2), "{c:?}");
                }
                let first = (byte - placements[c.tensor as usize].byte_offset) / eb;
                covered[c.tensor as usize].extend(first..first + c.len as u64);
            }
        }
        // The flat chunks cover exactly the same elements of each window.
        for w in &plan.windows {
            let elements = |chunks: &[Chunk]| {
                let mut v: Vec<u32> = chunks
                    .iter()
                    .flat_map(|c| c.start..c.start + c.len)
                    .collect();
                v.sort_unstable();
                v
            };
            let flat = &plan.flat[w.flat_begin as usize..w.flat_end as usize];
            assert!(flat.iter().all(|c| c.len >= 1));
            // Each flat chunk's segments lie inside it, in order.
            for (i, f) in flat.iter().enumerate() {
                let at = w.flat_begin as usize + i;
                let end = plan
                    .flat
                    .get(at + 1)
                    .map_or(plan.chunks.len(), |n| n.tensor as usize);
                let segs = &plan.chunks[f.tensor as usize..end];
                assert!(!segs.is_empty());
                assert_eq!(segs[0].start, f.start);
                assert_eq!(segs.iter().map(|s| s.len).sum::<u32>(), f.len);
                assert!(segs.windows(2).all(|p| p[0].start + p[0].len == p[1].start));
            }
            assert_eq!(
                elements(flat),
                elements(&plan.chunks[w.chunk_begin as usize..w.chunk_end as usize])
            );
        }
        for (t, cover) in covered.iter().enumerate() {
            assert_eq!(
                *cover,
                (0..layout.range(t).end - layout.range(t).start).collect::<Vec<u64>>()
            );
            let (a, b) = plan.tensor_chunks[t];
            assert!(plan.chunks[a as usize..b as usize]
                .iter()
                .all(|c| c.tensor as usize == t));
        }
    }

    #[test]
    fn packed_tensors_are_cut_at_chunks_and_windows() {
        let layout = GradLayout::from_sizes(&[5, 0, 17, 3, 0, 40]).unwrap();
        let placements = packed(&layout);
        let plan = plan(&layout, &placements, 4, 64, 16).unwrap();
        check_cover(&layout, &placements, &plan, 64);
        assert!(plan.windows.len() >= 5);
    }

    #[test]
    fn sixteen_bit_tensors_are_cut_on_words() {
        let layout = GradLayout::from_sizes(&[5, 0, 17, 3, 0, 40, 1]).unwrap();
        let placements = packed16(&layout);
        let plan = plan(&layout, &placements, 4, 64, 16).unwrap();
        check_cover(&layout, &placements, &plan, 64);
        assert_eq!(layout.packed_elements(GradType::F16), 6 + 18 + 4 + 40 + 2);
    }

    #[test]
    fn element_types_get_their_own_windows() {
        let layout = GradLayout::from_sizes(&[6, 6, 6]).unwrap();
        let types = [GradType::F32, GradType::Bf16, GradType::F32];
        let placements: Vec<Placement> = [0u64, 24, 36]
            .iter()
            .zip(types)
            .map(|(&byte_offset, dtype)| Placement {
                buffer: 0,
                byte_offset,
                dtype,
            })
            .collect();
        let plan = plan(&layout, &placements, 8, 256, 4).unwrap();
        check_cover(&layout, &placements, &plan, 256);
        let kinds: Vec<GradType> = plan.windows.iter().map(|w| w.dtype).collect();
        assert_eq!(kinds, types);
    }

    #[test]
    fn scattered_tensors_over_buffers() {
        let layout = GradLayout::from_sizes(&[10, 3, 7, 100]).unwrap();
        let placements =
            [(1, 1000), (0, 36), (1, 12), (0, 512)].map(|(buffer, byte_offset)| Placement {
                buffer,
                byte_offset,
                dtype: GradType::F32,
            });
        let plan = plan(&layout, &placements, 8, 256, 256).unwrap();
        check_cover(&layout, &placements, &plan, 256);
    }

    #[test]
    fn small_adjacent_tensors_share_flat_chunks() {
        let layout = GradLayout::from_sizes(&[3; 1000]).unwrap();
        let placements = packed(&layout);
        let plan = plan(&layout, &placements, 256, 1 << 20, 256).unwrap();
        assert_eq!(plan.flat.len(), 12); // 3000 elements in runs of at most 256
                                         // A tensor that straddles a flat boundary is two segments.
        let straddling = (1..12).filter(|k| (256 * k) % 3 != 0).count();
        assert_eq!(plan.chunks.len(), 1000 + straddling);
        check_cover(&layout, &placements, &plan, 1 << 20);
        assert!(plan.shared_chunks());
    }

    #[test]
    fn chunks_are_shared_only_where_a_tensor_boundary_falls_inside_one() {
        let shared = |sizes: &[usize]| {
            let layout = GradLayout::from_sizes(sizes).unwrap();
            plan(&layout, &packed(&layout), 256, 1 << 20, 256)
                .unwrap()
                .shared_chunks()
        };
        assert!(!shared(&[1000]));
        assert!(!shared(&[256, 512, 0, 100]));
        assert!(shared(&[256, 100, 100]));
        assert!(shared(&[1000, 1]));
    }

    #[test]
    fn overlapping_tensors_are_an_error() {
        let layout = GradLayout::from_sizes(&[10, 10]).unwrap();
        let placements = [(0, 0), (0, 36)].map(|(buffer, byte_offset)| Placement {
            buffer,
            byte_offset,
            dtype: GradType::F32,
        });
        assert_eq!(
            plan(&layout, &placements, 8, 256, 256),
            Err(Error::OverlappingTensors {
                first: 0,
                second: 1
            })
        );
    }

    #[test]
    fn zero_sized_tensors_only() {
        let layout = GradLayout::from_sizes(&[0, 0]).unwrap();
        let plan = plan(&layout, &packed(&layout), 8, 256, 256).unwrap();
        assert!(plan.chunks.is_empty() && plan.windows.is_empty());
    }
}
