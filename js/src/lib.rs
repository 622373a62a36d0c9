//! gradclip for JavaScript trainers on WebGPU.
//!
//! wgpu 30 can hand its WebGPU objects to JavaScript (`Device::as_webgpu`,
//! `Buffer::as_webgpu`) but cannot wrap a `GPUBuffer` that JavaScript made.
//! So this package creates the device and hands JavaScript its `GPUDevice`,
//! and creates the gradient buffer for a layout and hands back the
//! `GPUBuffer` that JavaScript shaders write into; every clip is recorded
//! into a command buffer of its own and submitted on the device's one queue,
//! in call order with JavaScript's own submissions (see `js/README.md` for
//! the contract).
//!
//! - [`core_api`]: every call into the gradclip core (the one module to
//!   change when the core's API changes).
//! - [`layout`]: where each tensor lives in the gradient buffer.
//! - `exports` (wasm32 only): the classes and functions JavaScript sees,
//!   wrapped by `js/lib/index.js`.

pub mod core_api;
pub mod layout;

#[cfg(target_arch = "wasm32")]
mod exports;
