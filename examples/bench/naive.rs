//! The per-tensor baseline: one norm dispatch and one scale dispatch per
//! tensor (`naive.wgsl`), to show what gradclip's offset table saves.

use wgpu::util::DeviceExt;

use crate::NormKind;

/// Elements one workgroup of a norm or scale dispatch covers (gradclip's chunk).
const ELEMENTS_PER_WORKGROUP: u64 = 8192;
/// The shader's workgroup size.
const WORKGROUP_SIZE: u32 = 256;
/// Timestamp queries one recorded step writes: begin and end of its 3 passes.
pub const TIMESTAMPS: u32 = 6;

/// Per-tensor record the shader reads through a dynamic uniform offset.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Tensor {
    offset: u32,
    len: u32,
    partial_base: u32,
    workgroups: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    partial_count: u32,
    max_norm: f32,
    _pad: [u32; 2],
}

/// Pipelines and layout, made once per device.
pub struct Naive {
    device: wgpu::Device,
    queue: wgpu::Queue,
    layout: wgpu::BindGroupLayout,
    norm_l2: wgpu::ComputePipeline,
    norm_inf: wgpu::ComputePipeline,
    total_l2: wgpu::ComputePipeline,
    total_inf: wgpu::ComputePipeline,
    scale: wgpu::ComputePipeline,
}

/// One gradient buffer and layout bound for the baseline.
pub struct NaiveSet {
    bind_group: wgpu::BindGroup,
    params: wgpu::Buffer,
    result: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// (dynamic offset, workgroups) of each non-empty tensor.
    dispatches: Vec<(u32, u32)>,
    partial_count: u32,
}

fn storage(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only: false },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

fn uniform(binding: u32, dynamic: bool, size: u64) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: dynamic,
            min_binding_size: wgpu::BufferSize::new(size),
        },
        count: None,
    }
}

impl Naive {
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("naive bind group layout"),
            entries: &[
                storage(0), // grads
                storage(1), // partials
                storage(2), // [norm, coefficient]
                uniform(3, true, size_of::<Tensor>() as u64),
                uniform(4, false, size_of::<Params>() as u64),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("naive pipeline layout"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("naive.wgsl"),
            source: wgpu::ShaderSource::Wgsl(include_str!("naive.wgsl").into()),
        });
        let pipeline = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&format!("naive {entry}")),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        Self {
            norm_l2: pipeline("norm_l2"),
            norm_inf: pipeline("norm_inf"),
            total_l2: pipeline("total_l2"),
            total_inf: pipeline("total_inf"),
            scale: pipeline("scale"),
            device: device.clone(),
            queue: queue.clone(),
            layout,
        }
    }

    /// Whether the baseline can run here: it binds the whole buffer at once.
    pub fn fits(device: &wgpu::Device, n: u64) -> bool {
        let limits = device.limits();
        n * 4 <= limits.max_storage_buffer_binding_size
            && n <= u32::MAX as u64
            && limits.max_compute_invocations_per_workgroup >= WORKGROUP_SIZE
    }

    /// Binds `grads` (at least `4 * n` bytes) cut into tensors of `sizes`.
    pub fn bind(&self, grads: &wgpu::Buffer, sizes: &[usize]) -> NaiveSet {
        let device = &self.device;
        let align = device.limits().min_uniform_buffer_offset_alignment as u64;
        let stride = (size_of::<Tensor>() as u64).div_ceil(align) * align;
        let mut records = vec![0u8; (sizes.len() as u64 * stride).max(stride) as usize];
        let mut dispatches = Vec::with_capacity(sizes.len());
        let (mut offset, mut partials) = (0u64, 0u64);
        for (k, &len) in sizes.iter().enumerate() {
            let len = len as u64;
            if len > 0 {
                let workgroups = len.div_ceil(ELEMENTS_PER_WORKGROUP).clamp(
                    1,
                    device.limits().max_compute_workgroups_per_dimension as u64,
                ) as u32;
                let record = Tensor {
                    offset: offset as u32,
                    len: len as u32,
                    partial_base: partials as u32,
                    workgroups,
                };
                let at = k * stride as usize;
                records[at..at + size_of::<Tensor>()].copy_from_slice(bytemuck::bytes_of(&record));
                dispatches.push(((k as u64 * stride) as u32, workgroups));
                partials += workgroups as u64;
            }
            offset += len;
        }
        let tensors = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("naive tensor records"),
            contents: &records,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("naive params"),
            size: size_of::<Params>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let partials_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("naive partials"),
            size: partials.max(1) * 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let result = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("naive result"),
            size: 8,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("naive result readback"),
            size: 8,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("naive bind group"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: grads,
                        offset: 0,
                        size: wgpu::BufferSize::new(offset.max(1) * 4),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: partials_buffer.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: result.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &tensors,
                        offset: 0,
                        size: wgpu::BufferSize::new(size_of::<Tensor>() as u64),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: params.as_entire_binding(),
                },
            ],
        });
        NaiveSet {
            bind_group,
            params,
            result,
            readback,
            dispatches,
            partial_count: partials as u32,
        }
    }

    /// Sets the clip threshold of `set` (a queue write: call outside timed loops).
    pub fn set_max_norm(&self, set: &NaiveSet, max_norm: f32) {
        let params = Params {
            partial_count: set.partial_count,
            max_norm,
            _pad: [0; 2],
        };
        self.queue
            .write_buffer(&set.params, 0, bytemuck::bytes_of(&params));
    }

    /// Records one clip: the norm pass (a dispatch per tensor), the total and
    /// the scale pass (a dispatch per tensor). With `timestamps`, writes
    /// [`TIMESTAMPS`] queries from the given index: begin and end of each pass.
    pub fn record(
        &self,
        set: &NaiveSet,
        encoder: &mut wgpu::CommandEncoder,
        norm: NormKind,
        timestamps: Option<(&wgpu::QuerySet, u32)>,
    ) {
        let writes = |k: u32| {
            timestamps.map(|(query_set, first)| wgpu::ComputePassTimestampWrites {
                query_set,
                beginning_of_pass_write_index: Some(first + 2 * k),
                end_of_pass_write_index: Some(first + 2 * k + 1),
            })
        };
        let (norm_pipeline, total_pipeline) = match norm {
            NormKind::L2 => (&self.norm_l2, &self.total_l2),
            NormKind::Inf => (&self.norm_inf, &self.total_inf),
            NormKind::P3 | NormKind::P1_5 | NormKind::P4_5 => {
                unreachable!("NaiveCases::runs never asks for a general p")
            }
        };
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("naive norms"),
                timestamp_writes: writes(0),
            });
            pass.set_pipeline(norm_pipeline);
            for &(offset, workgroups) in &set.dispatches {
                pass.set_bind_group(0, &set.bind_group, &[offset]);
                pass.dispatch_workgroups(workgroups, 1, 1);
            }
        }
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("naive total"),
                timestamp_writes: writes(1),
            });
            pass.set_pipeline(total_pipeline);
            pass.set_bind_group(0, &set.bind_group, &[0]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("naive scale"),
            timestamp_writes: writes(2),
        });
        pass.set_pipeline(&self.scale);
        for &(offset, workgroups) in &set.dispatches {
            pass.set_bind_group(0, &set.bind_group, &[offset]);
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
    }

    /// The (norm, coefficient) of the latest submitted clip on `set`.
    pub fn read_result(&self, set: &NaiveSet) -> Result<(f32, f32), String> {
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("naive result readback"),
            });
        encoder.copy_buffer_to_buffer(&set.result, 0, &set.readback, 0, 8);
        self.queue.submit([encoder.finish()]);
        let bytes = crate::read_mapped(&self.device, &set.readback)?;
        let v: [f32; 2] = bytemuck::pod_read_unaligned(&bytes[..8]);
        Ok((v[0], v[1]))
    }
}
