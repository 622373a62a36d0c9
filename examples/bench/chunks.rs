//! The per-chunk reduction experiment (`chunks.wgsl`,
//! `chunks_subgroup.wgsl`): what folding every chunk of K elements to one
//! partial costs, next to the same walk with no per-chunk fold.

use serde::Serialize;

use crate::roofline::{checked, storage, uniform, Walk};
use crate::Res;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fold {
    /// No per-chunk fold: one tree per workgroup at the end.
    None,
    /// A tree in workgroup memory per chunk: 1 + log2(WG) barriers.
    Tree,
    /// subgroupAdd per chunk, then the first subgroup adds the subgroups' sums.
    SubgroupAdd,
    /// The same with subgroupShuffleXor butterflies.
    Shuffle,
}

impl Fold {
    pub const ALL: [Fold; 4] = [Fold::None, Fold::Tree, Fold::SubgroupAdd, Fold::Shuffle];

    pub fn name(self) -> &'static str {
        match self {
            Fold::None => "none",
            Fold::Tree => "tree",
            Fold::SubgroupAdd => "subgroupAdd",
            Fold::Shuffle => "shuffleXor",
        }
    }

    fn entry_point(self) -> &'static str {
        match self {
            Fold::None => "chunks_none",
            Fold::Tree => "chunks_tree",
            Fold::SubgroupAdd => "chunks_subgroup_add",
            Fold::Shuffle => "chunks_shuffle",
        }
    }

    pub fn needs_subgroups(self) -> bool {
        matches!(self, Fold::SubgroupAdd | Fold::Shuffle)
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    len4: u32,
    chunks: u32,
    _pad: [u32; 2],
}

/// Accumulators per invocation within a chunk.
pub const ACC: u32 = 4;

/// One chunk length bound to one buffer, with its pipelines.
pub struct ChunkSet {
    device: wgpu::Device,
    queue: wgpu::Queue,
    bind_group: wgpu::BindGroup,
    partials: wgpu::Buffer,
    readback: wgpu::Buffer,
    pub k: u32,
    pub chunks: u32,
    pub len4: u64,
}

/// Modules and layout, made once per device.
pub struct Chunks {
    device: wgpu::Device,
    queue: wgpu::Queue,
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    plain: wgpu::ShaderModule,
    /// Only where the device has Features::SUBGROUP.
    subgroup: Option<wgpu::ShaderModule>,
}

impl Chunks {
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Res<Self> {
        checked(device, "chunk shaders", || {
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("chunks layout"),
                entries: &[storage(0, true), storage(1, false), uniform(2)],
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("chunks pipeline layout"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let module = |label, source: &'static str| {
                device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(label),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                })
            };
            Self {
                plain: module("chunks.wgsl", include_str!("chunks.wgsl")),
                subgroup: device
                    .features()
                    .contains(wgpu::Features::SUBGROUP)
                    .then(|| module("chunks_subgroup.wgsl", include_str!("chunks_subgroup.wgsl"))),
                device: device.clone(),
                queue: queue.clone(),
                layout,
                pipeline_layout,
            }
        })
    }

    pub fn has_subgroups(&self) -> bool {
        self.subgroup.is_some()
    }

    /// The pipeline of `fold` for chunks of `k` elements (a multiple of 4
    /// wg), `wg` invocations sharing each chunk as `walk` says.
    pub fn pipeline(&self, fold: Fold, k: u32, wg: u32, walk: Walk) -> Res<wgpu::ComputePipeline> {
        let module = if fold.needs_subgroups() {
            self.subgroup
                .as_ref()
                .ok_or("the device has no Features::SUBGROUP")?
        } else {
            &self.plain
        };
        if !k.is_multiple_of(4 * wg) || !wg.is_multiple_of(walk.team()) {
            return Err(format!("chunks: K = {k} is not a multiple of 4 x wg{wg} x team").into());
        }
        let label = format!("chunks {} K={k} wg{wg} {}", fold.name(), walk.name());
        let [walk_constant, team_constant] = walk.constants();
        checked(&self.device, &label, || {
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: Some(&self.pipeline_layout),
                    module,
                    entry_point: Some(fold.entry_point()),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &[
                            ("WG", wg as f64),
                            ("ACC", ACC as f64),
                            ("K4", (k / 4) as f64),
                            walk_constant,
                            team_constant,
                        ],
                        ..Default::default()
                    },
                    cache: None,
                })
        })
    }

    /// Binds the first 4 (n / 4) floats of `src` in chunks of `k` elements
    /// (a multiple of 4).
    pub fn bind(&self, src: &wgpu::Buffer, n: u64, k: u32) -> ChunkSet {
        let device = &self.device;
        let len4 = n / 4;
        let chunks = len4.div_ceil(k as u64 / 4) as u32;
        let bytes = chunks.max(crate::roofline::MAX_WORKGROUPS) as u64 * 4;
        let params = Params {
            len4: len4 as u32,
            chunks,
            _pad: [0; 2],
        };
        let params = wgpu::util::DeviceExt::create_buffer_init(
            device,
            &wgpu::util::BufferInitDescriptor {
                label: Some("chunks params"),
                contents: bytemuck::bytes_of(&params),
                usage: wgpu::BufferUsages::UNIFORM,
            },
        );
        let partials = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("chunks partials"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("chunks partials readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("chunks bind group"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: src,
                        offset: 0,
                        size: wgpu::BufferSize::new(16 * len4),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: partials.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: params.as_entire_binding(),
                },
            ],
        });
        ChunkSet {
            device: device.clone(),
            queue: self.queue.clone(),
            bind_group,
            partials,
            readback,
            k,
            chunks,
            len4,
        }
    }
}

impl ChunkSet {
    pub fn record(
        &self,
        pass: &mut wgpu::ComputePass,
        pipeline: &wgpu::ComputePipeline,
        workgroups: u32,
    ) {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(workgroups, 1, 1);
    }

    /// Runs `pipeline` (of `fold`) once on a buffer of ones and checks the
    /// partials: every chunk's sum for a per-chunk fold, every
    /// workgroup's for `Fold::None`, adding up to the element count.
    pub fn validate(
        &self,
        fold: Fold,
        pipeline: &wgpu::ComputePipeline,
        workgroups: u32,
    ) -> Res<()> {
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("chunks check"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("chunks check"),
                timestamp_writes: None,
            });
            self.record(&mut pass, pipeline, workgroups);
        }
        let count = if fold == Fold::None {
            workgroups
        } else {
            self.chunks
        };
        enc.copy_buffer_to_buffer(&self.partials, 0, &self.readback, 0, count as u64 * 4);
        self.queue.submit([enc.finish()]);
        let bytes = crate::read_mapped(&self.device, &self.readback)?;
        let partials: &[f32] = bytemuck::cast_slice(&bytes[..count as usize * 4]);
        let want = 4.0 * self.len4 as f64;
        let got: f64 = partials.iter().map(|&p| p as f64).sum();
        let chunk_ok = fold == Fold::None
            || partials.iter().enumerate().all(|(c, &p)| {
                let first = c as u64 * self.k as u64;
                p as u64 == (self.k as u64).min(4 * self.len4 - first)
            });
        // Integer sums of ones are exact below 2^24 per partial.
        let tolerance = if want / count as f64 >= (1u64 << 24) as f64 {
            1e-6 * want
        } else {
            0.0
        };
        if (got - want).abs() > tolerance || !chunk_ok {
            return Err(format!(
                "chunks {} K={} wrong: partials add up to {got} where {want} was expected{}",
                fold.name(),
                self.k,
                if chunk_ok {
                    ""
                } else {
                    " (a chunk's sum is off)"
                }
            )
            .into());
        }
        Ok(())
    }
}
