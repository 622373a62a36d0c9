//! Where each tensor lives in the gradient buffer the package creates: the
//! byte offsets JavaScript shaders write at, and the ranges the core binds.

use std::fmt;

/// Element type of a gradient buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    /// Parses the JavaScript name (`"f32"`, `"f16"`, `"bf16"`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "f32" => Some(Dtype::F32),
            "f16" => Some(Dtype::F16),
            "bf16" => Some(Dtype::Bf16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }
}

/// One tensor's place in the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorPlace {
    pub elements: u64,
    /// A multiple of 4 (of the requested alignment, which is at least 4).
    pub byte_offset: u64,
}

impl TensorPlace {
    /// Bytes of the tensor's elements.
    pub fn bytes(&self, dtype: Dtype) -> u64 {
        self.elements * dtype.bytes()
    }

    /// Bytes a storage binding of the tensor spans: its elements rounded up
    /// to a whole 4-byte word (WebGPU binds storage in words), at least one
    /// word. The word's other half, for an odd 16-bit tensor, is padding
    /// that no pass changes.
    pub fn binding_bytes(&self, dtype: Dtype) -> u64 {
        self.bytes(dtype).div_ceil(4).max(1) * 4
    }
}

/// The tensors' places and the size of the buffer that holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub dtype: Dtype,
    pub tensors: Vec<TensorPlace>,
    /// A multiple of 4; every tensor's binding (`binding_bytes`) fits.
    pub buffer_bytes: u64,
}

/// Why a placement cannot be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// No tensor at all.
    Empty,
    /// `align` is not a power of two of at least 4.
    BadAlignment(u64),
    /// The buffer would need more than 2^53 bytes (JavaScript's exact integers).
    Overflow,
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::Empty => write!(f, "a gradient layout needs at least one tensor"),
            LayoutError::BadAlignment(a) => {
                write!(f, "align must be a power of two of at least 4, got {a}")
            }
            LayoutError::Overflow => write!(f, "the layout's byte size overflows"),
        }
    }
}

/// Largest integer JavaScript numbers hold exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// Places tensors of `sizes` elements one after the other, each starting at
/// a multiple of `align` bytes (4: packed, as `GradLayout::packed_range`
/// packs them — back to back for f32, at even elements for 16-bit types;
/// 256: every tensor can be bound on its own at WebGPU's default
/// `minStorageBufferOffsetAlignment`).
pub fn place(sizes: &[u64], dtype: Dtype, align: u64) -> Result<Placement, LayoutError> {
    if sizes.is_empty() {
        return Err(LayoutError::Empty);
    }
    if align < 4 || !align.is_power_of_two() {
        return Err(LayoutError::BadAlignment(align));
    }
    let mut tensors = Vec::with_capacity(sizes.len());
    let mut end = 0u64;
    let mut buffer_bytes = 4u64;
    for &elements in sizes {
        let byte_offset = end
            .checked_next_multiple_of(align)
            .ok_or(LayoutError::Overflow)?;
        let bytes = elements
            .checked_mul(dtype.bytes())
            .ok_or(LayoutError::Overflow)?;
        end = byte_offset
            .checked_add(bytes)
            .ok_or(LayoutError::Overflow)?;
        let place = TensorPlace {
            elements,
            byte_offset,
        };
        buffer_bytes = buffer_bytes.max(byte_offset + place.binding_bytes(dtype));
        if buffer_bytes > MAX_SAFE {
            return Err(LayoutError::Overflow);
        }
        tensors.push(place);
    }
    Ok(Placement {
        dtype,
        tensors,
        buffer_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(p: &Placement) -> Vec<u64> {
        p.tensors.iter().map(|t| t.byte_offset).collect()
    }

    #[test]
    fn packed_f32_is_back_to_back() {
        let p = place(&[3, 5, 0, 2], Dtype::F32, 4).unwrap();
        assert_eq!(offsets(&p), [0, 12, 32, 32]);
        assert_eq!(p.buffer_bytes, 40);
    }

    #[test]
    fn packed_16_bit_tensors_start_at_even_elements() {
        let p = place(&[3, 4, 1], Dtype::F16, 4).unwrap();
        // elements 0..3 | pad | 4..8 | 8 | pad
        assert_eq!(offsets(&p), [0, 8, 16]);
        assert_eq!(p.tensors[2].binding_bytes(Dtype::F16), 4);
        assert_eq!(p.buffer_bytes, 20);
    }

    #[test]
    fn aligned_tensors_can_be_bound_alone() {
        let p = place(&[10, 1, 70], Dtype::Bf16, 256).unwrap();
        assert_eq!(offsets(&p), [0, 256, 512]);
        assert_eq!(p.buffer_bytes, 512 + 140);
        for t in &p.tensors {
            assert!(t.byte_offset + t.binding_bytes(p.dtype) <= p.buffer_bytes);
        }
    }

    #[test]
    fn zero_sized_tensors_still_have_a_word_to_bind() {
        let p = place(&[0], Dtype::F32, 4).unwrap();
        assert_eq!(p.buffer_bytes, 4);
        let p = place(&[2, 0], Dtype::F32, 4).unwrap();
        assert_eq!(offsets(&p), [0, 8]);
        assert_eq!(p.buffer_bytes, 12);
    }

    #[test]
    fn misuse_is_an_error() {
        assert_eq!(place(&[], Dtype::F32, 4), Err(LayoutError::Empty));
        assert_eq!(
            place(&[1], Dtype::F32, 2),
            Err(LayoutError::BadAlignment(2))
        );
        assert_eq!(
            place(&[1], Dtype::F32, 12),
            Err(LayoutError::BadAlignment(12))
        );
        assert_eq!(
            place(&[u64::MAX / 2], Dtype::F32, 4),
            Err(LayoutError::Overflow)
        );
        assert_eq!(place(&[1 << 52], Dtype::F32, 4), Err(LayoutError::Overflow));
    }
}
