//! The offset table of a flat gradient buffer and the chunk plan derived from it.

use crate::error::{Error, Result};
use crate::records::Chunk;

/// Where each tensor lives in a flat `f32` gradient buffer: tensors packed
/// back to back from element 0, in order. Zero-sized tensors are allowed.
///
/// ```
/// let layout = gradclip::GradLayout::from_sizes(&[784 * 128, 128, 128 * 10, 10])?;
/// assert_eq!(layout.len(), 4);
/// assert_eq!(layout.total_elements(), 101_770);
/// assert_eq!(layout.range(2), 100_480..101_760);
/// # Ok::<(), gradclip::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradLayout {
    /// offsets[i] .. offsets[i + 1] is tensor i; one more entry than tensors.
    offsets: Vec<u64>,
}

impl GradLayout {
    /// Packs tensors of the given element counts in order.
    ///
    /// Fails with [`Error::EmptyLayout`] for no tensors at all, and with
    /// [`Error::LayoutOverflow`] if the total does not fit in 64 bits.
    pub fn from_sizes(sizes: &[usize]) -> Result<Self> {
        if sizes.is_empty() {
            return Err(Error::EmptyLayout);
        }
        let mut offsets = Vec::with_capacity(sizes.len() + 1);
        let mut total: u64 = 0;
        offsets.push(0);
        for &size in sizes {
            total = total
                .checked_add(u64::try_from(size).map_err(|_| Error::LayoutOverflow)?)
                .ok_or(Error::LayoutOverflow)?;
            offsets.push(total);
        }
        Ok(Self { offsets })
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

    /// Element range of tensor `i` in the flat buffer.
    ///
    /// # Panics
    /// If `i >= self.len()`, like slice indexing.
    pub fn range(&self, i: usize) -> core::ops::Range<u64> {
        self.offsets[i]..self.offsets[i + 1]
    }

    /// Element counts of the tensors, in order.
    pub fn sizes(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.offsets.windows(2).map(|w| w[1] - w[0])
    }
}

/// One binding window: a range of the gradient buffer bound on its own,
/// because a storage binding is capped (128 MiB by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub first_element: u64,
    pub elements: u64,
    pub chunk_begin: u32,
    pub chunk_end: u32,
}

/// The chunk table and the windows for one layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub chunks: Vec<Chunk>,
    pub windows: Vec<Window>,
}

/// Cuts every tensor into chunks of at most `chunk_elements`, never across a
/// window boundary; windows are `window_elements` long. Zero-sized tensors
/// give no chunk. Fails if a count does not fit the `u32` fields the shaders read.
pub(crate) fn plan(layout: &GradLayout, chunk_elements: u32, window_elements: u64) -> Result<Plan> {
    debug_assert!(chunk_elements > 0 && window_elements > 0);
    let total = layout.total_elements();
    let mut windows: Vec<Window> = Vec::new();
    let mut chunks = Vec::new();
    for (tensor, size) in layout.sizes().enumerate() {
        let tensor = u32::try_from(tensor).map_err(|_| Error::TooLarge {
            what: "tensor count",
            needed: layout.len() as u64,
            limit: u32::MAX as u64,
        })?;
        let mut at = layout.offsets[tensor as usize];
        let end = at + size;
        while at < end {
            let w = at / window_elements;
            let window_start = w * window_elements;
            let window_end = (window_start + window_elements).min(total);
            let len = (end - at).min(chunk_elements as u64).min(window_end - at);
            while windows.len() as u64 <= w {
                let first_element = windows.len() as u64 * window_elements;
                let n = chunks.len() as u32;
                windows.push(Window {
                    first_element,
                    elements: (first_element + window_elements).min(total) - first_element,
                    chunk_begin: n,
                    chunk_end: n,
                });
            }
            chunks.push(Chunk {
                start: (at - window_start) as u32,
                len: len as u32,
                tensor,
            });
            let count = u32::try_from(chunks.len()).map_err(|_| Error::TooLarge {
                what: "chunk count",
                needed: chunks.len() as u64,
                limit: u32::MAX as u64,
            })?;
            windows[w as usize].chunk_end = count;
            at += len;
        }
    }
    Ok(Plan { chunks, windows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_element_once_in_order() {
        let layout = GradLayout::from_sizes(&[5, 0, 17, 3, 0, 40]).unwrap();
        let plan = plan(&layout, 4, 16).unwrap();
        let mut covered = Vec::new();
        for w in &plan.windows {
            for c in &plan.chunks[w.chunk_begin as usize..w.chunk_end as usize] {
                assert!(c.len >= 1 && c.len <= 4);
                assert!(c.start as u64 + c.len as u64 <= w.elements);
                let first = w.first_element + c.start as u64;
                assert!(layout.range(c.tensor as usize).contains(&first));
                covered.extend(first..first + c.len as u64);
            }
        }
        assert_eq!(covered, (0..65).collect::<Vec<u64>>());
        assert_eq!(plan.windows.len(), 5);
        assert_eq!(plan.windows[4].elements, 1);
    }

    #[test]
    fn zero_sized_tensors_only() {
        let layout = GradLayout::from_sizes(&[0, 0]).unwrap();
        let plan = plan(&layout, 8, 8).unwrap();
        assert!(plan.chunks.is_empty() && plan.windows.is_empty());
    }

    #[test]
    fn empty_layout_is_an_error() {
        assert_eq!(GradLayout::from_sizes(&[]), Err(Error::EmptyLayout));
    }
}
