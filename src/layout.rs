//! The offset table of the gradients: what a model's tensors are, in order.

use crate::dtype::GradType;
use crate::error::{Error, Result};

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
            let even = size.checked_add(size & 1).ok_or(Error::LayoutOverflow)?;
            even_total = even_total.checked_add(even).ok_or(Error::LayoutOverflow)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_layout_is_an_error() {
        assert_eq!(GradLayout::from_sizes(&[]), Err(Error::EmptyLayout));
    }

    #[test]
    fn sizes_that_overflow_are_errors_not_panics() {
        assert_eq!(
            GradLayout::from_sizes(&[usize::MAX]),
            Err(Error::LayoutOverflow)
        );
        assert_eq!(
            GradLayout::from_sizes(&[usize::MAX / 2, usize::MAX / 2, 4]),
            Err(Error::LayoutOverflow)
        );
        let fits = GradLayout::from_sizes(&[usize::MAX - 1]).unwrap();
        assert_eq!(fits.packed_elements(GradType::F16), (usize::MAX - 1) as u64);
    }
}
