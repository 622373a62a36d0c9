//! A fused SGD-with-momentum step that reads gradclip's clip coefficient.
//! Shared by the `fused_sgd` example and its test.

use wgpu::util::DeviceExt;

/// `Sgd` in sgd.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SgdUniform {
    lr: f32,
    momentum: f32,
    len: u32,
    flags: u32,
}

/// `APPLY_COEFFICIENT` and `SKIP_NONFINITE` in sgd.wgsl.
pub const APPLY_COEFFICIENT: u32 = 1;
#[allow(dead_code)] // used by the test of this example
pub const SKIP_NONFINITE: u32 = 2;

/// Only sizes the dispatch: the shader strides over `len` with whatever
/// workgroup count it gets.
const WORKGROUP_SIZE: u32 = 256;

/// One optimizer over one parameter buffer, its gradients and momentum.
pub struct FusedSgd {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    workgroups: u32,
}

pub struct SgdBuffers<'a> {
    pub params: &'a wgpu::Buffer,
    pub grads: &'a wgpu::Buffer,
    pub velocity: &'a wgpu::Buffer,
    /// `GradSet::coefficient_binding()`.
    pub clip: wgpu::BufferBinding<'a>,
}

fn storage(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

impl FusedSgd {
    pub fn new(
        device: &wgpu::Device,
        buffers: SgdBuffers<'_>,
        len: u32,
        lr: f32,
        momentum: f32,
        flags: u32,
    ) -> Self {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("fused sgd"),
            source: wgpu::ShaderSource::Wgsl(
                format!(
                    "{}\n{}",
                    gradclip::wgsl::CLIP_STATE,
                    include_str!("sgd.wgsl")
                )
                .into(),
            ),
        });
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("fused sgd bind group layout"),
            entries: &[
                storage(0, false),
                storage(1, true),
                storage(2, false),
                gradclip::wgsl::clip_state_layout_entry(3, wgpu::ShaderStages::COMPUTE),
                wgpu::BindGroupLayoutEntry {
                    binding: 4,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("fused sgd pipeline layout"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("fused sgd step"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("sgd_step"),
            compilation_options: Default::default(),
            cache: None,
        });
        let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("fused sgd hyperparameters"),
            contents: bytemuck::bytes_of(&SgdUniform {
                lr,
                momentum,
                len,
                flags,
            }),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("fused sgd bind group"),
            layout: &layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: buffers.params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: buffers.grads.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: buffers.velocity.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: wgpu::BindingResource::Buffer(buffers.clip),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: uniform.as_entire_binding(),
                },
            ],
        });
        let workgroups = len.div_ceil(WORKGROUP_SIZE).clamp(1, 65_535);
        Self {
            pipeline,
            bind_group,
            workgroups,
        }
    }

    /// Records one step into `encoder`.
    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("fused sgd step"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.workgroups, 1, 1);
    }
}
