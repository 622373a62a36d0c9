//! `Clipper`: the shader modules, the one bind-group layout and the pipelines,
//! created once per device.

// In the browser wgpu's objects are neither Send nor Sync, and need not be:
// there is one thread. The Arcs only share them between a Clipper and its
// GradSets.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

use std::sync::{Arc, Mutex};

use crate::config::Reduction;
use crate::dtype::{ElementPath, GradType};
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
    pipeline_layout: wgpu::PipelineLayout,
    pub pipelines: Pipelines,
    /// Reduce and scale pipelines per element path, made the first time a
    /// set needs them (f32's at creation), so that f32-only users compile
    /// no 16-bit shader.
    element_pipelines: Mutex<[Option<Arc<ElementPipelines>>; 4]>,
    /// The path f16 buffers take on this clipper.
    f16_path: ElementPath,
    pub workgroup_size: u32,
}

/// The finalize and finish pipelines, shared by every element type.
#[derive(Debug)]
pub(crate) struct Pipelines {
    finalize_l2: wgpu::ComputePipeline,
    finalize_inf: wgpu::ComputePipeline,
    finalize_p: wgpu::ComputePipeline,
    finish_l2: wgpu::ComputePipeline,
    finish_inf: wgpu::ComputePipeline,
    finish_p: wgpu::ComputePipeline,
}

/// The passes that touch the gradients, for one element path.
#[derive(Debug)]
pub(crate) struct ElementPipelines {
    reduce_l2: wgpu::ComputePipeline,
    reduce_inf: wgpu::ComputePipeline,
    reduce_p: wgpu::ComputePipeline,
    pub scale: wgpu::ComputePipeline,
    pub clamp: wgpu::ComputePipeline,
}

impl ElementPipelines {
    pub fn reduce(&self, r: Reduction) -> &wgpu::ComputePipeline {
        match r {
            Reduction::L2 => &self.reduce_l2,
            Reduction::Inf => &self.reduce_inf,
            Reduction::P => &self.reduce_p,
        }
    }
}

impl Pipelines {
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
    /// f16 gradients take the native path ([`ElementPath::F16Native`]) when
    /// the device was created with `wgpu::Features::SHADER_F16`
    /// ([`default_device`](crate::default_device) asks for it where the
    /// adapter has it), the packed one otherwise.
    ///
    /// Fails with [`Error::UnsupportedDevice`] on a device without compute
    /// shaders or with fewer than 4 storage buffers per stage (WebGL2, say),
    /// and with [`Error::Wgpu`] if wgpu rejects an object.
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<Self> {
        let native = device.features().contains(wgpu::Features::SHADER_F16);
        Self::create(device, queue, native)
    }

    /// Like [`new`](Self::new), but f16 gradients always take the packed
    /// `u32` path ([`ElementPath::F16Packed`]) that GL and WebGPU without
    /// `shader-f16` take, even where the device has `SHADER_F16`: to test
    /// that path on any adapter, or to compare the two.
    ///
    /// ```
    /// # let (device, queue, _) = pollster::block_on(gradclip::default_device())?;
    /// use gradclip::{Clipper, ElementPath};
    /// let auto = Clipper::new(&device, &queue)?;
    /// let native = device.features().contains(wgpu::Features::SHADER_F16);
    /// assert_eq!(auto.f16_path() == ElementPath::F16Native, native);
    /// let packed = Clipper::without_shader_f16(&device, &queue)?;
    /// assert_eq!(packed.f16_path(), ElementPath::F16Packed);
    /// # Ok::<(), gradclip::Error>(())
    /// ```
    pub fn without_shader_f16(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<Self> {
        Self::create(device, queue, false)
    }

    fn create(device: &wgpu::Device, queue: &wgpu::Queue, native_f16: bool) -> Result<Self> {
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
                storage_entry(0, false), // grads (one binding window, any element type)
                storage_entry(1, true),  // chunk table
                storage_entry(2, false), // per-chunk partials
                wgpu::BindGroupLayoutEntry {
                    // stats: clip state, total partial, scaler, at least one tensor's stat
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
        let finalize = make_pipelines(device, &pipeline_layout, &shaders::FINALIZE, workgroup_size);
        let f32_pipelines =
            make_element_pipelines(device, &pipeline_layout, ElementPath::F32, workgroup_size);
        catch.end()?;
        let mut made = finalize.into_iter();
        let mut next = || made.next().expect("one pipeline per listed entry point");
        let pipelines = Pipelines {
            finalize_l2: next(),
            finalize_inf: next(),
            finalize_p: next(),
            finish_l2: next(),
            finish_inf: next(),
            finish_p: next(),
        };
        let mut element_pipelines: [Option<Arc<ElementPipelines>>; 4] = Default::default();
        element_pipelines[ElementPath::F32.index()] = Some(Arc::new(f32_pipelines));
        Ok(Self {
            inner: Arc::new(Inner {
                device: device.clone(),
                queue: queue.clone(),
                bind_group_layout,
                pipeline_layout,
                pipelines,
                element_pipelines: Mutex::new(element_pipelines),
                f16_path: if native_f16 {
                    ElementPath::F16Native
                } else {
                    ElementPath::F16Packed
                },
                workgroup_size,
            }),
        })
    }

    /// The path f16 gradients take on this clipper: [`ElementPath::F16Native`]
    /// with `SHADER_F16`, [`ElementPath::F16Packed`] without it (GL, WebGPU
    /// without `shader-f16`) or when made with [`without_shader_f16`](Self::without_shader_f16).
    pub fn f16_path(&self) -> ElementPath {
        self.inner.f16_path
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
        self.bind_as(grads, layout, GradType::F32)
    }

    /// Binds a flat gradient buffer of `dtype` elements: tensor `i` is at
    /// elements [`layout.packed_range(i, dtype)`](GradLayout::packed_range)
    /// — back to back for f32; for f16 and bf16 each tensor starts at an
    /// even element (an odd-sized tensor is followed by one padding element,
    /// which no pass changes), so that no 32-bit word holds two tensors.
    ///
    /// The buffer needs `STORAGE` usage and at least
    /// `dtype.bytes() * layout.packed_elements(dtype)` bytes.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// let layout = gradclip::GradLayout::from_sizes(&[3, 2])?;
    /// // bf16 bits of [3, 0, 0 | pad | 4, 0]: tensor 1 starts at element 4.
    /// let bits: [u16; 6] = [0x4040, 0, 0, 0, 0x4080, 0];
    /// let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: Some("bf16 grads"), contents: bytemuck::cast_slice(&bits),
    ///     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind_as(&grads, &layout, gradclip::GradType::Bf16)?;
    /// assert_eq!(set.element_paths(), [gradclip::ElementPath::Bf16Packed]);
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.clip_norm(&mut encoder, &gradclip::ClipNorm::new(1.0))?;
    /// queue.submit([encoder.finish()]);
    /// assert_eq!(set.read_report().await?.total_norm, 5.0);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind_as(
        &self,
        grads: &wgpu::Buffer,
        layout: &GradLayout,
        dtype: GradType,
    ) -> Result<GradSet> {
        require_storage(grads)?;
        let needed = layout
            .packed_elements(dtype)
            .checked_mul(dtype.bytes())
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
                byte_offset: dtype.bytes() * layout.packed_range(t, dtype).start,
                dtype,
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
        let typed: Vec<(wgpu::BufferBinding<'_>, GradType)> =
            ranges.iter().map(|r| (r.clone(), GradType::F32)).collect();
        self.bind_ranges_as(layout, &typed)
    }

    /// [`bind_ranges`](Self::bind_ranges) with an element type per range:
    /// one clip, one global norm over f32, f16 and bf16 tensors together
    /// (an f32 master-gradient buffer and a bf16 buffer, as FusedLAMB
    /// clips them). A range of `n` elements of `dtype` holds
    /// `n * dtype.bytes()` bytes at a 4-byte aligned offset (for 16-bit
    /// types: an even element, so that no 32-bit word holds two tensors);
    /// a 16-bit range with an odd `n` needs its last 4-byte word inside the
    /// buffer, and the half of it past the range keeps its bits.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// use gradclip::GradType;
    /// let buffer = |bytes: &[u8]| device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: Some("grads"), contents: bytes, usage: wgpu::BufferUsages::STORAGE });
    /// let master = buffer(bytemuck::cast_slice(&[3.0f32]));
    /// let half = buffer(bytemuck::cast_slice(&[0x4080u16, 0])); // bf16 [4, pad]
    /// let layout = gradclip::GradLayout::from_named(&[("w", 1), ("b", 1)])?;
    /// let set = clipper.bind_ranges_as(&layout, &[
    ///     (master.as_entire_buffer_binding(), GradType::F32),
    ///     (wgpu::BufferBinding { buffer: &half, offset: 0, size: wgpu::BufferSize::new(2) }, GradType::Bf16),
    /// ])?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.record_norm(&mut encoder, &gradclip::ClipNorm::new(1.0))?;
    /// queue.submit([encoder.finish()]);
    /// assert_eq!(set.read_report().await?.total_norm, 5.0);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn bind_ranges_as(
        &self,
        layout: &GradLayout,
        ranges: &[(wgpu::BufferBinding<'_>, GradType)],
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
        for (tensor, ((range, dtype), elements)) in ranges.iter().zip(layout.sizes()).enumerate() {
            require_storage(range.buffer)?;
            if !range.offset.is_multiple_of(4) {
                return Err(Error::MisalignedTensor {
                    tensor,
                    offset: range.offset,
                });
            }
            let layout_bytes = elements
                .checked_mul(dtype.bytes())
                .ok_or(Error::LayoutOverflow)?;
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
            // The passes bind and write whole 4-byte words.
            let end = range
                .offset
                .checked_add(layout_bytes.div_ceil(4) * 4)
                .ok_or(Error::LayoutOverflow)?;
            if end > range.buffer.size() {
                return Err(Error::LayoutExceedsBuffer {
                    needed: end,
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
                dtype: *dtype,
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

impl Inner {
    /// The path a window of `dtype` takes on this clipper.
    pub fn path_of(&self, dtype: GradType) -> ElementPath {
        match dtype {
            GradType::F32 => ElementPath::F32,
            GradType::F16 => self.f16_path,
            GradType::Bf16 => ElementPath::Bf16Packed,
        }
    }

    /// The pipelines of `path`, made on first use (errors caught and returned).
    pub fn element_pipelines(&self, path: ElementPath) -> Result<Arc<ElementPipelines>> {
        let mut cache = self
            .element_pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(made) = &cache[path.index()] {
            return Ok(made.clone());
        }
        let catch = Catch::begin(&self.device);
        let made = make_element_pipelines(
            &self.device,
            &self.pipeline_layout,
            path,
            self.workgroup_size,
        );
        catch.end()?;
        let made = Arc::new(made);
        cache[path.index()] = Some(made.clone());
        Ok(made)
    }
}

fn make_pipelines(
    device: &wgpu::Device,
    layout: &wgpu::PipelineLayout,
    module: &PassModule,
    workgroup_size: u32,
) -> Vec<wgpu::ComputePipeline> {
    let constants = [(shaders::WORKGROUP_SIZE_OVERRIDE, workgroup_size as f64)];
    let shader = create_module(device, module);
    module
        .entry_points
        .iter()
        .map(|entry| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&format!("{} {entry}", module.name)),
                layout: Some(layout),
                module: &shader,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
        })
        .collect()
}

fn make_element_pipelines(
    device: &wgpu::Device,
    layout: &wgpu::PipelineLayout,
    path: ElementPath,
    workgroup_size: u32,
) -> ElementPipelines {
    let (reduce, scale) = shaders::element_modules(path);
    let mut reduce = make_pipelines(device, layout, &reduce, workgroup_size).into_iter();
    let mut scale = make_pipelines(device, layout, &scale, workgroup_size).into_iter();
    let next = |it: &mut std::vec::IntoIter<wgpu::ComputePipeline>| {
        it.next().expect("one pipeline per listed entry point")
    };
    ElementPipelines {
        reduce_l2: next(&mut reduce),
        reduce_inf: next(&mut reduce),
        reduce_p: next(&mut reduce),
        scale: next(&mut scale),
        clamp: next(&mut scale),
    }
}

fn create_module(device: &wgpu::Device, module: &PassModule) -> wgpu::ShaderModule {
    device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(module.name),
        source: wgpu::ShaderSource::Wgsl(module.source().into()),
    })
}
