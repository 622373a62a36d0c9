//! WGSL for your own shaders, exported so that nothing is copied by hand.
//!
//! An optimizer that applies the clip on load (4 bytes per element instead
//! of a scale pass's 8), or a loss shader that multiplies by the loss scale,
//! binds a set's [`GradSet::coefficient_binding`](crate::GradSet::coefficient_binding)
//! and declares it with [`CLIP_STATE`]:
//!
//! ```
//! let source = format!(
//!     "{}\n@group(0) @binding(3) var<storage, read> clip: ClipState;\n{}",
//!     gradclip::wgsl::CLIP_STATE,
//!     "@group(0) @binding(0) var<storage, read_write> g: array<f32>;
//!      @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
//!          if id.x < arrayLength(&g) { g[id.x] = clip_apply(g[id.x], clip); }
//!      }",
//! );
//! # let (device, _queue, _) = pollster::block_on(gradclip::default_device())?;
//! let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
//!     label: Some("my optimizer"),
//!     source: wgpu::ShaderSource::Wgsl(source.into()),
//! });
//! let entry = gradclip::wgsl::clip_state_layout_entry(3, wgpu::ShaderStages::COMPUTE);
//! # let _ = (module, entry);
//! # Ok::<(), gradclip::Error>(())
//! ```

/// The `ClipState` struct (the 64 bytes at
/// [`coefficient_binding`](crate::GradSet::coefficient_binding)) and
/// `clip_apply(g: f32, clip: ClipState) -> f32`, which multiplies a gradient
/// exactly as gradclip's scale pass does (the factor exact even below
/// `f32::MIN_POSITIVE`, PyTorch's and TensorFlow's NaN/inf rules), plus its
/// helpers (`clip_compose`, `clip_fast_factor`, `clip_mul_exact`) and the
/// `CLIP_SCALE_*` values of `ClipState.scale_kind`
/// ([`records::CLIP_SCALE_MULTIPLY`](crate::records::CLIP_SCALE_MULTIPLY) and
/// the others). Every gradclip shader module starts with this very text.
pub const CLIP_STATE: &str = include_str!("../shaders/clip_state.wgsl");

/// The bind-group-layout entry for
/// [`coefficient_binding`](crate::GradSet::coefficient_binding): read-only
/// storage, 64 bytes at least.
pub fn clip_state_layout_entry(
    binding: u32,
    visibility: wgpu::ShaderStages,
) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only: true },
            has_dynamic_offset: false,
            min_binding_size: wgpu::BufferSize::new(size_of::<crate::records::ClipState>() as u64),
        },
        count: None,
    }
}
