//! Global-norm gradient clipping on the GPU with wgpu and WGSL.
//!
//! Gradients live in one flat `f32`, `f16` or `bf16` buffer, tensors packed
//! back to back (or in ranges of several buffers, each with its own
//! [`GradType`]); a [`GradLayout`] is their offset table. Mixed-precision
//! training gets GradScaler's unscale, inf check and dynamic loss scaling
//! fused into the clip ([`ClipNorm::unscale`], [`LossScaler`]). A [`Clipper`] owns the pipelines, a
//! [`GradSet`] binds one gradient buffer, and each clip records three passes
//! into your command encoder: a reduction over fixed-size chunks, one small
//! dispatch that turns the chunk partials into the norm and the coefficient,
//! and an in-place scale whose workgroup count is decided on the GPU (zero
//! when nothing needs clipping). Nothing is read back unless you ask.
//!
//! ```
//! # fn main() -> Result<(), gradclip::Error> { pollster::block_on(async {
//! use wgpu::util::DeviceExt;
//! let (device, queue, _info) = gradclip::default_device().await?;
//! let grads: Vec<f32> = (0..101_770).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
//! let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
//!     label: Some("grads"),
//!     contents: bytemuck::cast_slice(&grads),
//!     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
//! });
//!
//! let clipper = gradclip::Clipper::new(&device, &queue)?;
//! let layout = gradclip::GradLayout::from_sizes(&[784 * 128, 128, 128 * 10, 10])?;
//! let set = clipper.bind(&buffer, &layout)?;
//! let mut enc = device.create_command_encoder(&Default::default());
//! set.clip_norm(&mut enc, &gradclip::ClipNorm::new(1.0).norm(gradclip::Norm::L2))?;
//! queue.submit([enc.finish()]);
//! let report = set.read_report().await?;
//! assert!(report.total_norm > 1.0 && report.coefficient < 1.0);
//! # Ok(()) }) }
//! ```

// Modules from the device up: each uses only those above it (records,
// errors and the small utilities aside).
mod adaptive; // adaptive thresholds (ZClip, AutoClip)
mod clipper; // device-level kernels
mod config;
mod device;
mod dtype;
mod error;
mod gpu_errors;
mod grad_set; // a bound set
mod layout;
mod lock;
mod partial;
mod plan; // planning of a layout
mod readback;
pub mod records;
mod report;
mod scaler;
pub mod shaders;
mod upload;
pub mod wgsl; // reports

pub use adaptive::{
    AdaGc, AdaptiveClip, AdaptiveDecision, AdaptiveMethod, Agc, AgcClip, AgcUnits, AutoClip,
    TensorDecision, UnitReport, ZClip, ZClipMode, ZClipTo,
};
pub use clipper::Clipper;
pub use config::{ClipNorm, Norm, Semantics};
pub use device::default_device;
pub use dtype::{ElementPath, GradType};
pub use error::{Error, Result};
pub use grad_set::GradSet;
pub use layout::GradLayout;
pub use partial::NormPartial;
pub use report::{ClipReport, Reports};
pub use scaler::LossScaler;
