//! `Clipper`: the shader modules, the one bind-group layout and the pipelines,
//! created once per device.

use std::sync::Arc;

use crate::config::Reduction;
use crate::error::{Error, Result};
use crate::gpu_errors::Catch;
use crate::grad_set::{require_storage, GradSet};
use crate::layout::{GradLayout, Placement};
use crate::records::{ClipConfig, TensorStat, WindowInfo, STATS_HEAD_SIZE};
use crate::shaders::{self, PassModule};

/// Largest workgroup size the passes use; WebGPU's default limit.
const PREFERRED_WORKGROUP_SIZE: u32 = 256;
/// Smallest workgroup size accepted from a device's limits.
const MIN_WORKGROUP_SIZE: u32 = 32;

/// Owns everything about gradient clipping that depends only on the device:
/// shader modules, the bind-group layout shared by all passes and the
/// pipelines. Cheap to clone (shared internally).
///
/// ```
/// # let (device, queue, _) = pollster::block_on(gradclip::default_device())?;
/// let clipper = gradclip::Clipper::new(&device, &queue)?;
/// assert!(clipper.workgroup_size().is_power_of_two());
/// # Ok::<(), gradclip::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Clipper {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub bind_group_layout: wgpu::BindGroupLayout,
    pub pipelines: Pipelines,
    pub workgroup_size: u32,
}

#[derive(Debug)]
pub(crate) struct Pipelines {
    reduce_l2: wgpu::ComputePipeline,
    reduce_inf: wgpu::ComputePipeline,
    reduce_p: wgpu::ComputePipeline,
    finalize_l2: wgpu::ComputePipeline,
    finalize_inf: wgpu::ComputePipeline,
    finalize_p: wgpu::ComputePipeline,
    finish_l2: wgpu::ComputePipeline,
    finish_inf: wgpu::ComputePipeline,
    finish_p: wgpu::ComputePipeline,
    pub scale: wgpu::ComputePipeline,
    pub clamp: wgpu::ComputePipeline,
}

impl Pipelines {
    pub fn reduce(&self, r: Reduction) -> &wgpu::ComputePipeline {
        match r {
            Reduction::L2 => &self.reduce_l2,
            Reduction::Inf => &self.reduce_inf,
            Reduction::P => &self.reduce_p,
        }
    }

    pub fn finalize(&self, r: Reduction) -> &wgpu::ComputePipeline {
        match r {
            Reduction::L2 => &self.finalize_l2,
            Reduction::Inf => &self.finalize_inf,
            Reduction::P => &self.finalize_p,
        }
    }

    pub fn finish(&self, r: Reduction) -> &wgpu::ComputePipeline {
        match r {
            Reduction::L2 => &self.finish_l2,
            Reduction::Inf => &self.finish_inf,
            Reduction::P => &self.finish_p,
        }
    }
}

fn check_limit(what: &'static str, have: u64, need: u64) -> Result<()> {
    if have < need {
        return Err(Error::UnsupportedDevice { what, have, need });
    }
    Ok(())
}

/// The largest power-of-two workgroup size the device allows, up to 256.
fn workgroup_size(limits: &wgpu::Limits) -> Result<u32> {
    let cap = PREFERRED_WORKGROUP_SIZE
        .min(limits.max_compute_invocations_per_workgroup)
        .min(limits.max_compute_workgroup_size_x);
    // Workgroup memory: one vec3<f32> (16-byte stride) and one u32 per invocation.
    let by_memory = limits.max_compute_workgroup_storage_size / 20;
    let size = 1u32 << (31 - cap.min(by_memory).max(1).leading_zeros());
    check_limit("max workgroup size", size as u64, MIN_WORKGROUP_SIZE as u64)?;
    Ok(size)
}

fn storage_entry(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
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

fn uniform_entry<T>(binding: u32, dynamic: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: dynamic,
            min_binding_size: wgpu::BufferSize::new(core::mem::size_of::<T>() as u64),
        },
        count: None,
    }
}

impl Clipper {
    /// Creates the pipelines on `device`; keeps clones of `device` and `queue`.
    ///
    /// Fails with [`Error::UnsupportedDevice`] on a device without compute
    /// shaders or with fewer than 4 storage buffers per stage (WebGL2, say),
    /// and with [`Error::Wgpu`] if wgpu rejects an object.
    // In the browser wgpu's objects are neither Send nor Sync, and need not
    // be: there is one thread. The Arc only shares them between a Clipper
    // and its GradSets.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<Self> {
        let limits = device.limits();
        check_limit(
            "storage buffers per shader stage",
            limits.max_storage_buffers_per_shader_stage as u64,
            4,
        )?;
        check_limit(
            "uniform buffers per shader stage",
            limits.max_uniform_buffers_per_shader_stage as u64,
            2,
        )?;
        check_limit(
            "dynamic uniform buffers per pipeline layout",
            limits.max_dynamic_uniform_buffers_per_pipeline_layout as u64,
            1,
        )?;
        let workgroup_size = workgroup_size(&limits)?;

        let catch = Catch::begin(device);
        let bind_group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("gradclip bind group layout"),
            entries: &[
                storage_entry(0, false), // grads (one binding window)
                storage_entry(1, true),  // chunk table
                storage_entry(2, false), // per-chunk partials
                wgpu::BindGroupLayoutEntry {
                    // stats: clip state, total partial, at least one tensor's stat
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: wgpu::BufferSize::new(
                            STATS_HEAD_SIZE + size_of::<TensorStat>() as u64,
                        ),
                    },
                    ..storage_entry(3, false)
                },
                uniform_entry::<WindowInfo>(4, false),
                uniform_entry::<ClipConfig>(5, true),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("gradclip pipeline layout"),
            bind_group_layouts: &[Some(&bind_group_layout)],
            immediate_size: 0,
        });
        let constants = [(shaders::WORKGROUP_SIZE_OVERRIDE, workgroup_size as f64)];
        let mut made = Vec::new();
        for module in shaders::MODULES {
            let shader = create_module(device, &module);
            for entry in module.entry_points {
                made.push(
                    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(&format!("gradclip {entry}")),
                        layout: Some(&pipeline_layout),
                        module: &shader,
                        entry_point: Some(entry),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &constants,
                            zero_initialize_workgroup_memory: false,
                        },
                        cache: None,
                    }),
                );
            }
        }
        catch.end()?;
        let mut made = made.into_iter();
        let mut next = || made.next().expect("one pipeline per listed entry point");
        let pipelines = Pipelines {
            reduce_l2: next(),
            reduce_inf: next(),
            reduce_p: next(),
            finalize_l2: next(),
            finalize_inf: next(),
            finalize_p: next(),
            finish_l2: next(),
            finish_inf: next(),
            finish_p: next(),
            scale: next(),
            clamp: next(),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                device: device.clone(),
                queue: queue.clone(),
                bind_group_layout,
                pipelines,
                workgroup_size,
            }),
        })
    }

    /// Binds a flat gradient buffer laid out by `layout` (tensors packed from
    /// byte 0): creates the chunk table, scratch buffers and bind groups
    /// once, for every later clip on it.
    ///
    /// The buffer needs `STORAGE` usage and at least `4 * layout.total_elements()` bytes.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let layout = gradclip::GradLayout::from_sizes(&[784 * 128, 128])?;
    /// let grads = device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("grads"),
    ///     size: 4 * layout.total_elements(),
    ///     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
    ///     mapped_at_creation: false,
    /// });
    /// let set = clipper.bind(&grads, &layout)?;
    /// assert_eq!(set.window_count(), 1);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind(&self, grads: &wgpu::Buffer, layout: &GradLayout) -> Result<GradSet> {
        require_storage(grads)?;
        let needed = layout
            .total_elements()
            .checked_mul(4)
            .ok_or(Error::LayoutOverflow)?;
        let max_buffer_size = self.inner.device.limits().max_buffer_size;
        if needed > max_buffer_size {
            return Err(Error::TooLarge {
                what: "layout size in bytes",
                needed,
                limit: max_buffer_size,
            });
        }
        if needed > grads.size() {
            return Err(Error::LayoutExceedsBuffer {
                needed,
                buffer_size: grads.size(),
            });
        }
        let placements: Vec<Placement> = (0..layout.len())
            .map(|t| Placement {
                buffer: 0,
                byte_offset: 4 * layout.range(t).start,
            })
            .collect();
        GradSet::new(self.inner.clone(), &[grads], &placements, layout)
    }

    /// Binds gradients that live anywhere: tensor `i` of `layout` is the
    /// `f32` range `ranges[i]` (any buffer with `STORAGE` usage, a 4-byte
    /// aligned offset, and a size of `4 * elements` bytes, or `None` for the
    /// rest of the buffer), as frameworks that sub-allocate pooled buffers
    /// lay them out. One clip covers them all, with one dispatch per binding
    /// window (a stretch of one buffer within the device's storage binding
    /// limit) whatever the number of tensors. Overlapping ranges are an error.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let pool = |size| device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("pooled"), size, usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false });
    /// let (pool_a, pool_b) = (pool(1 << 20), pool(1 << 16));
    /// let layout = gradclip::GradLayout::from_named(&[("w", 1000), ("b", 10)])?;
    /// let set = clipper.bind_ranges(&layout, &[
    ///     wgpu::BufferBinding { buffer: &pool_a, offset: 4096, size: wgpu::BufferSize::new(4000) },
    ///     wgpu::BufferBinding { buffer: &pool_b, offset: 12, size: wgpu::BufferSize::new(40) },
    /// ])?;
    /// assert_eq!(set.window_count(), 2);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind_ranges(
        &self,
        layout: &GradLayout,
        ranges: &[wgpu::BufferBinding<'_>],
    ) -> Result<GradSet> {
        if ranges.len() != layout.len() {
            return Err(Error::RangeMismatch {
                tensor: ranges.len().min(layout.len()),
                range_bytes: 0,
                layout_bytes: 0,
            });
        }
        let mut buffers: Vec<&wgpu::Buffer> = Vec::new();
        let mut placements = Vec::with_capacity(ranges.len());
        for (tensor, (range, elements)) in ranges.iter().zip(layout.sizes()).enumerate() {
            require_storage(range.buffer)?;
            if !range.offset.is_multiple_of(4) {
                return Err(Error::MisalignedTensor {
                    tensor,
                    offset: range.offset,
                });
            }
            let layout_bytes = 4 * elements;
            let range_bytes = match range.size {
                Some(size) => size.get(),
                None => range.buffer.size().saturating_sub(range.offset),
            };
            if elements > 0 && range_bytes != layout_bytes {
                return Err(Error::RangeMismatch {
                    tensor,
                    range_bytes,
                    layout_bytes,
                });
            }
            if range.offset + layout_bytes > range.buffer.size() {
                return Err(Error::LayoutExceedsBuffer {
                    needed: range.offset + layout_bytes,
                    buffer_size: range.buffer.size(),
                });
            }
            let buffer = match buffers.iter().position(|b| *b == range.buffer) {
                Some(index) => index,
                None => {
                    buffers.push(range.buffer);
                    buffers.len() - 1
                }
            };
            placements.push(Placement {
                buffer,
                byte_offset: range.offset,
            });
        }
        GradSet::new(self.inner.clone(), &buffers, &placements, layout)
    }

    /// Invocations per workgroup of every pass on this device.
    pub fn workgroup_size(&self) -> u32 {
        self.inner.workgroup_size
    }

    /// The device the pipelines were made on.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }
}

fn create_module(device: &wgpu::Device, module: &PassModule) -> wgpu::ShaderModule {
    device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(module.name),
        source: wgpu::ShaderSource::Wgsl(module.source().into()),
    })
}
