//! Planning the passes over a layout: where each tensor lives (checked
//! against the buffers and the device), the binding windows, the chunk
//! tables, and the limits they must fit. Everything a bind or a rebind
//! validates is here, before anything is allocated for it.

use crate::dtype::GradType;
use crate::error::{Error, Result};
use crate::layout::GradLayout;
use crate::records::{Chunk, Partial, TensorStat, STATS_HEAD_SIZE};

/// Elements of one chunk: the unit of work of one workgroup in the reduce
/// and scale passes, and the granularity of the partials.
pub const CHUNK_ELEMENTS: u32 = 8192;
/// Upper bound on the workgroups of a grid-stride dispatch.
const MAX_WORKGROUPS: u32 = 2048;

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

/// The chunk tables, the windows, and each tensor's chunk range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Chunks that each belong to one tensor (for per-tensor results).
    pub chunks: Vec<Chunk>,
    /// The same elements cut without regard to tensor boundaries: adjacent
    /// tensors of a window merge into runs, so that a clip of the global
    /// norm over thousands of small tensors costs what one tensor costs.
    /// Runs never bridge a gap between tensors (foreign data lives there).
    pub flat: Vec<Chunk>,
    pub windows: Vec<Window>,
    pub tensor_chunks: Vec<(u32, u32)>,
}

/// Marks a flat chunk, which belongs to no single tensor.
pub(crate) const NO_TENSOR: u32 = u32::MAX;

/// Merges a window's per-tensor chunks (in increasing `start` order) into
/// runs of contiguous elements, recut at `chunk_elements`.
fn flat_chunks(chunks: &[Chunk], chunk_elements: u32, out: &mut Vec<Chunk>) {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for c in chunks {
        match runs.last_mut() {
            Some((_, end)) if *end == c.start => *end += c.len,
            _ => runs.push((c.start, c.start + c.len)),
        }
    }
    for (mut start, end) in runs {
        while start < end {
            let len = (end - start).min(chunk_elements);
            out.push(Chunk {
                start,
                len,
                tensor: NO_TENSOR,
            });
            start += len;
        }
    }
}

fn count_u32(what: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::TooLarge {
        what,
        needed: n as u64,
        limit: u32::MAX as u64,
    })
}

/// Cuts every tensor into chunks of at most `chunk_elements` (even), never
/// across a window; a window starts at an `align`-aligned byte offset, spans
/// at most `window_bytes` (a multiple of 4) and holds one element type.
/// Tensors are visited in buffer and offset order so that each window's
/// chunks are contiguous in the table; each tensor's chunks are contiguous
/// too. Overlapping tensors are an error. With tensors at 4-byte aligned
/// offsets (checked by the callers), every chunk of a 16-bit tensor starts at
/// an even element and only a tensor's last chunk can have an odd length.
pub(crate) fn plan(
    layout: &GradLayout,
    placements: &[Placement],
    chunk_elements: u32,
    window_bytes: u64,
    align: u64,
) -> Result<Plan> {
    debug_assert!(chunk_elements > 0 && window_bytes >= align && placements.len() == layout.len());
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
    let mut windows: Vec<Window> = Vec::new();
    let mut chunks = Vec::new();
    let mut tensor_chunks = vec![(0u32, 0u32); layout.len()];
    count_u32("tensor count", layout.len())?;
    for &t in &order {
        let first = count_u32("chunk count", chunks.len())?;
        let Placement {
            buffer,
            byte_offset,
            dtype,
        } = placements[t];
        let eb = dtype.bytes();
        let (mut at, end) = (byte_offset, byte_offset + bytes_of(t));
        while at < end {
            let fits = windows.last().is_some_and(|w| {
                w.buffer == buffer
                    && w.dtype == dtype
                    && at >= w.byte_offset
                    && at + 4 <= w.byte_offset + window_bytes
            });
            if !fits {
                let n = count_u32("chunk count", chunks.len())?;
                windows.push(Window {
                    buffer,
                    dtype,
                    byte_offset: at / align * align,
                    bytes: 0,
                    chunk_begin: n,
                    chunk_end: n,
                    flat_begin: 0,
                    flat_end: 0,
                });
            }
            let w = windows.last_mut().expect("a window was just ensured");
            let elements = ((end - at) / eb)
                .min(chunk_elements as u64)
                .min((w.byte_offset + window_bytes - at) / eb);
            chunks.push(Chunk {
                start: ((at - w.byte_offset) / eb) as u32,
                len: elements as u32,
                tensor: t as u32,
            });
            at += eb * elements;
            w.bytes = (at - w.byte_offset).div_ceil(4) * 4;
            w.chunk_end = count_u32("chunk count", chunks.len())?;
        }
        tensor_chunks[t] = (first, count_u32("chunk count", chunks.len())?);
    }
    let mut flat = Vec::new();
    for w in &mut windows {
        w.flat_begin = count_u32("chunk count", flat.len())?;
        flat_chunks(
            &chunks[w.chunk_begin as usize..w.chunk_end as usize],
            chunk_elements,
            &mut flat,
        );
        w.flat_end = count_u32("chunk count", flat.len())?;
    }
    Ok(Plan {
        chunks,
        flat,
        windows,
        tensor_chunks,
    })
}

/// A plan with everything the GPU tables and dispatches need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bound {
    pub plan: Plan,
    /// Grid-stride workgroups over per-tensor chunks, and over flat chunks.
    pub workgroups: u32,
    pub flat_workgroups: u32,
}

impl Bound {
    /// Plans `placed` for a device with `limits`: windows start at multiples
    /// of the storage offset alignment and stay under both the binding limit
    /// and the 2^32 elements a u32 can index; the tables must fit a binding.
    pub fn new(layout: &GradLayout, placed: &Placed<'_>, limits: &wgpu::Limits) -> Result<Self> {
        let align = (limits.min_storage_buffer_offset_alignment as u64).max(4);
        let max_binding = limits.max_storage_buffer_binding_size.min(u32::MAX as u64) / 4 * 4;
        too_large("storage offset alignment", align, max_binding)?;
        let plan = plan(
            layout,
            &placed.placements,
            CHUNK_ELEMENTS,
            max_binding / align * align,
            align,
        )?;
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
        Ok(Self {
            workgroups: busiest(|w| w.chunk_end - w.chunk_begin),
            flat_workgroups: busiest(|w| w.flat_end - w.flat_begin),
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
    /// Partials, indexed like the chunk table: per-tensor chunks, then flat ones.
    pub fn partials_len(&self) -> u64 {
        (self.chunks.len() + self.flat.len()) as u64
    }

    /// Words of the plan table: the chunks, then two words per tensor.
    pub fn table_words_len(&self) -> u64 {
        3 * self.partials_len() + 2 * self.tensor_chunks.len() as u64
    }

    /// Word index of the per-tensor partial ranges in the table.
    pub fn ranges_at(&self) -> u32 {
        (3 * self.partials_len()) as u32
    }

    /// The plan table the shaders read: per-tensor chunks, flat chunks (three
    /// words each), then each tensor's range of partials (its per-tensor
    /// chunks). Never empty: a binding cannot be.
    pub fn table_words(&self) -> Vec<u32> {
        let mut words = Vec::with_capacity(self.table_words_len().max(1) as usize);
        for c in self.chunks.iter().chain(&self.flat) {
            words.extend_from_slice(&[c.start, c.len, c.tensor]);
        }
        for &(begin, end) in &self.tensor_chunks {
            words.extend_from_slice(&[begin, end]);
        }
        if words.is_empty() {
            words.push(0);
        }
        words
    }
}
#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(flat.iter().all(|c| c.len >= 1 && c.tensor == NO_TENSOR));
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
        assert_eq!(plan.chunks.len(), 1000);
        assert_eq!(plan.flat.len(), 12); // 3000 elements in runs of at most 256
        check_cover(&layout, &placements, &plan, 1 << 20);
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
