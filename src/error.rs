//! The crate's error type.

/// Everything that can go wrong in gradclip. Misuse is reported before any GPU
/// work is recorded, so the gradients are untouched whenever a call returns
/// an error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `max_norm` / `clip_norm` is NaN, infinite or negative (or zero under
    /// TensorFlow semantics, which requires it to be positive).
    #[error(
        "max_norm must be finite and non-negative (positive for TensorFlow semantics), got {0}"
    )]
    InvalidMaxNorm(f32),
    /// A `Norm::P(p)` with p NaN, or below the smallest normal f32
    /// ([`Norm::MIN_P`](crate::Norm::MIN_P)): a subnormal p has no finite
    /// reciprocal, and drivers that flush subnormals would read it as 0.
    #[error("norm order p must be at least f32::MIN_POSITIVE and not NaN, got {0}")]
    InvalidNormOrder(f32),
    /// `clip_value` bounds that are NaN or out of order.
    #[error("clip_value needs min <= max and neither NaN, got [{min}, {max}]")]
    InvalidClampRange { min: f32, max: f32 },
    /// A layout without any tensor.
    #[error("a gradient layout needs at least one tensor")]
    EmptyLayout,
    /// The layout's total element count overflows 64 bits.
    #[error("the layout's element count overflows")]
    LayoutOverflow,
    /// Two tensors share bytes of the same buffer.
    #[error("tensors {first} and {second} overlap in their buffer")]
    OverlappingTensors { first: usize, second: usize },
    /// A tensor's byte offset is not a multiple of 4. For 16-bit tensors this
    /// means an even element: the passes read and write 16-bit elements in
    /// whole 32-bit words, and a word must never hold two tensors.
    #[error("tensor {tensor} starts at byte {offset}, which is not 4-byte aligned (16-bit tensors must start at an even element)")]
    MisalignedTensor { tensor: usize, offset: u64 },
    /// The number of buffer ranges differs from the number of tensors, or a
    /// range's size differs from its tensor's.
    #[error(
        "tensor {tensor}: the range holds {range_bytes} bytes but the layout needs {layout_bytes}"
    )]
    RangeMismatch {
        tensor: usize,
        range_bytes: u64,
        layout_bytes: u64,
    },
    /// This operation does not support the requested mode.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// `LossScaler` parameters outside GradScaler's domain.
    #[error("invalid loss scaler: {0}")]
    InvalidLossScaler(&'static str),
    /// The layout needs more bytes than the gradient buffer has (for a 16-bit
    /// tensor with an odd element count, up to the end of its last 4-byte word).
    #[error("the layout needs {needed} bytes but the gradient buffer has {buffer_size}")]
    LayoutExceedsBuffer { needed: u64, buffer_size: u64 },
    /// The gradient buffer was created without usages the clip needs.
    #[error("the gradient buffer lacks the usage {missing:?}")]
    MissingUsage { missing: wgpu::BufferUsages },
    /// The layout is larger than this device can address or bind.
    #[error(
        "the layout is too large for this device: {what} is {needed}, the device allows {limit}"
    )]
    TooLarge {
        what: &'static str,
        needed: u64,
        limit: u64,
    },
    /// The device lacks a limit the passes need.
    #[error("the device does not support gradclip: {what} is {have}, at least {need} is needed")]
    UnsupportedDevice {
        what: &'static str,
        have: u64,
        need: u64,
    },
    /// The total norm was NaN or infinite and the clip asked for
    /// `error_if_nonfinite`: the gradients were left bit-for-bit untouched.
    #[error("the total norm is non-finite ({total_norm}); gradients left untouched")]
    NonFinite { total_norm: f32 },
    /// A [`NormPartial`](crate::NormPartial) holds bits that no reduction of
    /// that norm can produce (unknown flag bits, a negative, infinite or NaN
    /// value, a p-sum below 1 or with a mantissa outside [1, 2)). Returned by
    /// `NormPartial::from_bytes`, `combine` and `total_norm`, by
    /// `clip_with_partial` before recording, and by the report of a
    /// `clip_with_partial_from` whose buffer held such bits (the gradients
    /// were left untouched).
    #[error("invalid norm partial: {0}")]
    InvalidPartial(&'static str),
    /// A gradient buffer (or a partial's source buffer) is mapped: a
    /// submission that uses it would be rejected. Unmap it first.
    #[error("the {what} is mapped; unmap it before recording GPU work on it")]
    BufferMapped { what: &'static str },
    /// A gradient buffer (or a partial's source buffer) was destroyed.
    #[error("the {what} was destroyed")]
    BufferDestroyed { what: &'static str },
    /// A buffer or query set passed in belongs to another device than the clipper's.
    #[error("the {what} belongs to another device than the clipper's")]
    ForeignDevice { what: &'static str },
    /// A query set passed to `clip_norm_timed` is not a timestamp query set.
    #[error("the query set must be of type QueryType::Timestamp")]
    NotTimestampQuerySet,
    /// The device was lost or destroyed: nothing can be created or recorded on it.
    #[error("the device is lost: {0}")]
    DeviceLost(String),
    /// `read_report` was called before any `clip_norm` was recorded on the set.
    #[error("no clip_norm has been recorded on this gradient set")]
    NoReport,
    /// None of the recorded clips has run on the GPU (never submitted, or
    /// the submission was rejected), so no report exists yet.
    #[error("no recorded clip_norm has been submitted and run yet")]
    NotSubmitted,
    /// Mapping the report's readback buffer failed (device lost, say).
    #[error("reading the clip report back failed: {0}")]
    Readback(String),
    /// Invalid parameters of an adaptive clipping method.
    #[error("invalid adaptive clipping parameters: {0}")]
    InvalidAdaptive(&'static str),
    /// Bytes given to `AdaptiveClip::restore_state` that no state of this
    /// adaptive clip can hold.
    #[error("invalid adaptive clipping state: {0}")]
    InvalidAdaptiveState(&'static str),
    /// wgpu reported an error while gradclip created its objects.
    #[error("wgpu error: {0}")]
    Wgpu(String),
}

/// `Result` with gradclip's [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;
