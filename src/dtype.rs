//! Element types of gradient buffers and the shader paths that read them.

/// The element type of a gradient buffer (or of one range of it).
///
/// Accumulation is always in f32 with the overflow-safe scaled scheme, so
/// the norm is right even where it exceeds the element type's range (f16
/// elements of 60 000 give norms in the millions); scaling writes back in the
/// element type, rounded to nearest even.
///
/// 16-bit tensors must start at an even element (a 4-byte aligned byte
/// offset): the passes then own whole 32-bit words and no word holds two
/// tensors. [`Clipper::bind_as`](crate::Clipper::bind_as) pads each tensor to
/// an even element count for that reason ([`GradLayout::packed_range`](crate::GradLayout::packed_range)).
///
/// ```
/// use gradclip::GradType;
/// assert_eq!(GradType::Bf16.bytes(), 2);
/// assert_eq!(GradType::F32.bytes(), 4);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GradType {
    /// IEEE binary32.
    #[default]
    F32,
    /// IEEE binary16 (`torch.float16`).
    F16,
    /// bfloat16 (`torch.bfloat16`): the top half of an f32.
    Bf16,
}

impl GradType {
    /// Bytes per element.
    pub const fn bytes(self) -> u64 {
        match self {
            GradType::F32 => 4,
            GradType::F16 | GradType::Bf16 => 2,
        }
    }
}

/// How the shaders access one binding window's elements: which of the
/// reduce / scale modules runs on it. [`GradSet::element_paths`](crate::GradSet::element_paths)
/// says which a set uses.
///
/// ```
/// # let (device, queue, _) = pollster::block_on(gradclip::default_device())?;
/// // GL and WebGPU without `shader-f16` always take the packed path; it can be forced.
/// let packed = gradclip::Clipper::without_shader_f16(&device, &queue)?;
/// assert_eq!(packed.f16_path(), gradclip::ElementPath::F16Packed);
/// # Ok::<(), gradclip::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElementPath {
    /// `array<vec4<f32>>`: a window whose binding is a whole number of
    /// 16-byte quads (every window of a buffer whose size is a multiple of 16
    /// bytes).
    F32,
    /// `array<f32>`, four loads per quad: a window that ends where its
    /// buffer does, on no 16-byte boundary. The same walk and arithmetic as
    /// [`F32`](Self::F32), so the same bits.
    F32Unaligned,
    /// `array<f16>` through `wgpu::Features::SHADER_F16`.
    F16Native,
    /// f16 pairs read from and written to `array<u32>` words with integer
    /// decoding and round-to-nearest-even encoding: GL, and WebGPU without
    /// `shader-f16`.
    F16Packed,
    /// bf16 pairs in `array<u32>` words (WGSL has no bf16 type).
    Bf16Packed,
}

impl ElementPath {
    pub(crate) const COUNT: usize = 5;

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The element type this path reads.
    pub fn grad_type(self) -> GradType {
        match self {
            ElementPath::F32 | ElementPath::F32Unaligned => GradType::F32,
            ElementPath::F16Native | ElementPath::F16Packed => GradType::F16,
            ElementPath::Bf16Packed => GradType::Bf16,
        }
    }
}
