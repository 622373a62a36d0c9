//! The offset table of the gradients and the chunk plan derived from it.

use crate::dtype::GradType;
use crate::error::{Error, Result};
use crate::records::Chunk;

/// The tensors of a model's gradients: their element counts, in order, and
/// optionally their names. [`Clipper::bind`](crate::Clipper::bind) packs them
/// back to back in one `f32` buffer; [`Clipper::bind_ranges`](crate::Clipper::bind_ranges)
/// places each one anywhere in any buffer. Zero-sized tensors are allowed.
///
/// ```
/// let layout = gradclip::GradLayout::from_named(&[("fc1.weight", 784 * 128), ("fc1.bias", 128)])?;
/// assert_eq!(layout.len(), 2);
/// assert_eq!(layout.total_elements(), 100_480);
/// assert_eq!(layout.range(1), 100_352..100_480);
/// assert_eq!(layout.name(1), Some("fc1.bias"));
/// # Ok::<(), gradclip::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradLayout {
    /// offsets[i] .. offsets[i + 1] is tensor i when packed; one more entry than tensors.
    offsets: Vec<u64>,
    /// Start of tensor i when packed as a 16-bit type (each tensor padded to
    /// an even element count); one more entry than tensors.
    even_offsets: Vec<u64>,
    names: Option<Vec<String>>,
}

impl GradLayout {
    /// Tensors of the given element counts, in order.
    ///
    /// Fails with [`Error::EmptyLayout`] for no tensors at all, and with
    /// [`Error::LayoutOverflow`] if the total does not fit in 64 bits.
    pub fn from_sizes(sizes: &[usize]) -> Result<Self> {
        if sizes.is_empty() {
            return Err(Error::EmptyLayout);
        }
        let mut offsets = Vec::with_capacity(sizes.len() + 1);
        let mut even_offsets = Vec::with_capacity(sizes.len() + 1);
        let (mut total, mut even_total): (u64, u64) = (0, 0);
        offsets.push(0);
        even_offsets.push(0);
        for &size in sizes {
            let size = u64::try_from(size).map_err(|_| Error::LayoutOverflow)?;
            total = total.checked_add(size).ok_or(Error::LayoutOverflow)?;
            even_total = even_total
                .checked_add(size + (size & 1))
                .ok_or(Error::LayoutOverflow)?;
            offsets.push(total);
            even_offsets.push(even_total);
        }
        Ok(Self {
            offsets,
            even_offsets,
            names: None,
        })
    }

    /// Named tensors (`("fc1.weight", elements)`), in order; reports can then
    /// name each per-tensor norm.
    pub fn from_named(tensors: &[(&str, usize)]) -> Result<Self> {
        let sizes: Vec<usize> = tensors.iter().map(|t| t.1).collect();
        Ok(Self {
            names: Some(tensors.iter().map(|t| t.0.to_string()).collect()),
            ..Self::from_sizes(&sizes)?
        })
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Always false: a layout holds at least one tensor.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Elements of all tensors together.
    pub fn total_elements(&self) -> u64 {
        self.offsets[self.len()]
    }

    /// Element range of tensor `i` when the tensors are packed in one buffer.
    ///
    /// # Panics
    /// If `i >= self.len()`, like slice indexing.
    pub fn range(&self, i: usize) -> core::ops::Range<u64> {
        self.offsets[i]..self.offsets[i + 1]
    }

    /// Element range of tensor `i` in a buffer of `dtype` bound with
    /// [`Clipper::bind_as`](crate::Clipper::bind_as): for 16-bit types each
    /// tensor starts at an even element (odd-sized tensors are followed by
    /// one padding element that the passes never change); for f32, [`range`](Self::range).
    ///
    /// ```
    /// let layout = gradclip::GradLayout::from_sizes(&[3, 4])?;
    /// assert_eq!(layout.packed_range(1, gradclip::GradType::F16), 4..8);
    /// assert_eq!(layout.packed_range(1, gradclip::GradType::F32), 3..7);
    /// assert_eq!(layout.packed_elements(gradclip::GradType::Bf16), 8);
    /// # Ok::<(), gradclip::Error>(())
    /// ```
    ///
    /// # Panics
    /// If `i >= self.len()`, like slice indexing.
    pub fn packed_range(&self, i: usize, dtype: GradType) -> core::ops::Range<u64> {
        match dtype {
            GradType::F32 => self.range(i),
            GradType::F16 | GradType::Bf16 => {
                let start = self.even_offsets[i];
                start..start + (self.offsets[i + 1] - self.offsets[i])
            }
        }
    }

    /// Elements (padding included) of a buffer of `dtype` packed by
    /// [`Clipper::bind_as`](crate::Clipper::bind_as); times
    /// [`GradType::bytes`] is the buffer size it needs.
    pub fn packed_elements(&self, dtype: GradType) -> u64 {
        match dtype {
            GradType::F32 => self.total_elements(),
            GradType::F16 | GradType::Bf16 => self.even_offsets[self.len()],
        }
    }

    /// Element counts of the tensors, in order.
    pub fn sizes(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.offsets.windows(2).map(|w| w[1] - w[0])
    }

    /// Name of tensor `i`, if the layout was made with names.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.names
            .as_ref()
            .and_then(|n| n.get(i))
            .map(String::as_str)
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

    #[test]
    fn empty_layout_is_an_error() {
        assert_eq!(GradLayout::from_sizes(&[]), Err(Error::EmptyLayout));
    }
}
