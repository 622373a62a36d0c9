//! The crate's error type.

/// What can go wrong when clipping a burn model's gradients. Every error is
/// returned before anything is recorded on the GPU, so the gradients are
/// untouched whenever [`GradClipper::clip`](crate::GradClipper::clip) fails.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// gradclip refused the parameters, the gradients' places or the device.
    #[error(transparent)]
    Clip(#[from] gradclip::Error),
    /// A gradient does not live on burn's wgpu backend (another backend, or
    /// an autodiff tensor where the plain gradient was expected).
    #[error("parameter {param}: the gradient is not a tensor of burn's wgpu backend ({reason})")]
    NotWgpu { param: String, reason: String },
    /// A gradient of an element type gradclip does not clip (f32, f16 and
    /// bf16 are clipped).
    #[error("parameter {param}: gradients of type {dtype} are not supported (f32, f16, bf16)")]
    UnsupportedDType { param: String, dtype: String },
    /// cubecl could not hand out a gradient's storage, or its work failed.
    #[error("parameter {param}: cubecl refused the gradient's storage: {reason}")]
    Storage { param: String, reason: String },
    /// Flushing burn's queued work before the clip failed.
    #[error("flushing burn's queued GPU work failed: {0}")]
    Flush(String),
    /// No wgpu adapter or device could be had, or burn refused it.
    #[error("wgpu device: {0}")]
    Adapter(String),
    /// Reports were asked for before any clip was recorded.
    #[error("no clip has been recorded yet")]
    NoClip,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;
