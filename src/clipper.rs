//! `Clipper`: the shader modules, the one bind-group layout and the pipelines,
//! each created once per device (the pipelines on first use).

// In the browser wgpu's objects are neither Send nor Sync, and need not be:
// there is one thread. The Arcs only share them between a Clipper and its
// GradSets.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

use std::sync::{Arc, Mutex, OnceLock};

use crate::config::Reduction;
use crate::dtype::{ElementPath, GradType};
use crate::error::{Error, Result};
use crate::gpu_errors::{check_alive, Catch};
use crate::lock::lock;
use crate::records::{ClipConfig, TensorStat, WindowInfo, DISPATCH_SIZE, STATS_HEAD_SIZE};
use crate::shaders::{self, PassModule};
use crate::upload::Uploads;

/// Largest workgroup size the passes use on a GPU; WebGPU's default limit.
const PREFERRED_WORKGROUP_SIZE: u32 = 256;
/// Workgroup size on CPU adapters (lavapipe, llvmpipe GL, SwiftShader,
/// WARP). They run a workgroup's SIMD groups one after another up to each
/// barrier, so a barrier costs a switch per group: at 256 invocations the
/// per-chunk folds' barriers took most of the reduce pass (examples/bench,
/// docs/bench-cpu-drivers.md). 32 is the smallest size the folds take.
const CPU_WORKGROUP_SIZE: u32 = MIN_WORKGROUP_SIZE;
/// Workgroup size of the scale and clamp passes on CPU adapters. They
/// have no barrier and sum nothing, so neither the folds' minimum nor the
/// order of sums binds them, and fewer invocations per chunk give each a
/// longer run of its own to stream: 10^7 and 2.5*10^7 elements, one and
/// 10 000 tensors, L2 clip, the scale pass at 16 against 32 invocations
/// took 91-96% of the multiply roofline against 85-90% on lavapipe and
/// llvmpipe GL (8: 84-89%, 4: 60-78%, a SIMD group's lanes left idle).
const CPU_STREAM_WORKGROUP_SIZE: u32 = 16;
/// The same on CPU adapters whose subgroups are at most
/// [`NARROW_SUBGROUP`] lanes wide (SwiftShader, whose SIMD width is 4):
/// there 4 invocations took 80-81% of the multiply roofline, 8 78-80%, 16
/// 77-78% and 32 74-75% (the same cases).
const NARROW_CPU_STREAM_WORKGROUP_SIZE: u32 = 4;
/// See [`NARROW_CPU_STREAM_WORKGROUP_SIZE`] and
/// [`CPU_TENSORS_PER_INVOCATION`].
const NARROW_SUBGROUP: u32 = 4;
/// Tensors each invocation of `tensor_stats` takes on CPU adapters, where
/// they run the general path's masked pass once per block of tensors,
/// however few of the block need it (200 000 one-element tensors on
/// lavapipe, tensor_stats 2.5 ms with one tensor per invocation, 1.5 with
/// a block each). On adapters of [`NARROW_SUBGROUP`] lanes (SwiftShader)
/// each invocation takes a whole [`shaders::TENSOR_STAT_BLOCK`] instead:
/// there that pass (clip_of's whole body, once an invocation) costs more
/// than eight tensors' plain path (10^7 elements, 10^4 and 5 * 10^4
/// tensors, tensor_stats and finalize: L2 1.0-1.1 and 4.3-4.6 ms with 8
/// tensors an invocation, 0.68-0.76 and 2.9-3.3 with 32; p = 3 1.7-1.8
/// and 7.9-8.5, 1.4 and 6.3-6.7; 64 to 256 no faster),
/// while lavapipe and llvmpipe GL took 10-60% longer with 32 than with 8
/// (fewer workgroups to share out).
const CPU_TENSORS_PER_INVOCATION: u32 = 8;
/// Smallest workgroup size accepted from a device's limits.
const MIN_WORKGROUP_SIZE: u32 = 32;
// A team divides every workgroup size the host picks (powers of two from
// the smallest up).
const _: () = assert!(
    MIN_WORKGROUP_SIZE.is_multiple_of(shaders::GPU_TEAM)
        && CPU_WORKGROUP_SIZE.is_multiple_of(shaders::CPU_TEAM)
        && CPU_STREAM_WORKGROUP_SIZE.is_multiple_of(shaders::CPU_TEAM)
        && NARROW_CPU_STREAM_WORKGROUP_SIZE.is_multiple_of(shaders::CPU_TEAM)
);

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
    /// The scale and clamp passes': `bind_group_layout` without binding 6,
    /// the scale dispatch's indirect arguments.
    pub stream_bind_group_layout: wgpu::BindGroupLayout,
    /// One storage binding: a bind group of a buffer on it validates only
    /// where that buffer belongs (see [`Inner::check_owns`]).
    probe_layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    stream_pipeline_layout: wgpu::PipelineLayout,
    pipelines: Pipelines,
    /// Staging buffers that carry each clip's parameters into its encoder.
    pub uploads: Uploads,
    /// The shader modules of each element path, made the first time a set
    /// binds a window of it; their pipelines are made on first use.
    element_pipelines: Mutex<[Option<Arc<ElementPipelines>>; ElementPath::COUNT]>,
    /// The path f16 buffers take on this clipper.
    f16_path: ElementPath,
    pub workgroup_size: u32,
    /// Invocations per workgroup of the scale and clamp passes: the
    /// workgroup size but on CPU adapters ([`CPU_STREAM_WORKGROUP_SIZE`]).
    stream_workgroup_size: u32,
    /// The longest flat chunk of a set on this device (see
    /// [`GradSet::chunk_elements`](crate::GradSet::chunk_elements)).
    pub chunk_elements: u32,
    /// Invocations that read each piece of a run in turns (the `TEAM`
    /// override: [`shaders::GPU_TEAM`] or [`shaders::CPU_TEAM`]).
    pub team: u32,
    /// Tensors each invocation of the per-tensor statistics pass takes
    /// at least, where a set has that many.
    pub tensors_per_invocation: u32,
}

/// A pipeline compiled the first time a clip records it. Compiling is the
/// slow part of making a clipper (seconds per pipeline on SwiftShader, and
/// slow in browsers too), and most programs record only a few of the
/// pipelines: one norm's reduce, finalize and scale, say.
type Lazy = OnceLock<wgpu::ComputePipeline>;

/// The finalize pipelines (from the reduce's partials, or from a supplied
/// total) and the per-tensor statistics, one per reduction kind, shared by
/// every element type; the module they come from.
#[derive(Debug)]
struct Pipelines {
    module: wgpu::ShaderModule,
    finalize: [Lazy; Reduction::COUNT],
    finish: [Lazy; Reduction::COUNT],
    tensor_stats: [Lazy; Reduction::COUNT],
    long_tensor_stats: [Lazy; Reduction::COUNT],
}

/// The passes that touch the gradients, for one element path: its two
/// modules and their pipelines.
#[derive(Debug)]
pub(crate) struct ElementPipelines {
    path: ElementPath,
    reduce_module: wgpu::ShaderModule,
    scale_module: wgpu::ShaderModule,
    /// Entry point `reduce` (global results only), then `reduce_tensors`
    /// without the tracked walk, and with it, without and with fused
    /// tensors, without and with the segment lists, then with fused
    /// tensors and no segment outside unit runs, then with every chunk
    /// tracked, without and with fused tensors ([`Clipper::reduce`]).
    reduce: [[Lazy; Reduction::REDUCE_VARIANTS]; 9],
    scale: Lazy,
    clamp: Lazy,
}

fn check_limit(what: &'static str, have: u64, need: u64) -> Result<()> {
    if have < need {
        return Err(Error::UnsupportedDevice { what, have, need });
    }
    Ok(())
}

/// The largest power-of-two workgroup size the device allows, up to 256
/// (32 on a CPU adapter).
fn workgroup_size(limits: &wgpu::Limits, device_type: wgpu::DeviceType) -> Result<u32> {
    let preferred = match device_type {
        wgpu::DeviceType::Cpu => CPU_WORKGROUP_SIZE,
        _ => PREFERRED_WORKGROUP_SIZE,
    };
    let cap = preferred
        .min(limits.max_compute_invocations_per_workgroup)
        .min(limits.max_compute_workgroup_size_x);
    // The reduce pass takes the most workgroup memory of all passes.
    let by_memory = limits
        .max_compute_workgroup_storage_size
        .saturating_sub(shaders::REDUCE_WORKGROUP_FIXED_BYTES)
        / shaders::REDUCE_WORKGROUP_BYTES_PER_INVOCATION;
    let size = 1u32 << (31 - cap.min(by_memory).max(1).leading_zeros());
    check_limit("max workgroup size", size as u64, MIN_WORKGROUP_SIZE as u64)?;
    Ok(size)
}

/// What the clipper's choices read from the device's adapter: its type,
/// and the widest subgroup it reports (wgpu's default bounds where the
/// backend has none: GL).
struct AdapterTraits {
    device_type: wgpu::DeviceType,
    subgroup_max_size: u32,
}

/// The browser's WebGPU may not expose the adapter behind a device
/// (GPUDevice.adapterInfo is recent): there it counts as a GPU whose
/// subgroups may be as wide as wgpu allows.
fn adapter_traits(device: &wgpu::Device) -> AdapterTraits {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = device;
        AdapterTraits {
            device_type: wgpu::DeviceType::Other,
            subgroup_max_size: wgpu::MAXIMUM_SUBGROUP_MAX_SIZE,
        }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let info = device.adapter_info();
        AdapterTraits {
            device_type: info.device_type,
            subgroup_max_size: info.subgroup_max_size,
        }
    }
}

/// A compute-visible storage buffer entry of a bind group layout.
pub(crate) fn storage_entry(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
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

/// A compute-visible uniform buffer entry holding a `T`.
pub(crate) fn uniform_entry<T>(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: wgpu::BufferSize::new(core::mem::size_of::<T>() as u64),
        },
        count: None,
    }
}

impl Clipper {
    /// Prepares clipping on `device`; keeps clones of `device` and `queue`.
    /// Each pipeline is compiled the first time a clip records it, so the
    /// first step of each kind (norm, per-tensor norms, value clipping, a
    /// supplied total) takes longer than the ones after it, and pipelines
    /// that a program never records are never compiled. f16 gradients take
    /// the native path ([`ElementPath::F16Native`]) when the device was
    /// created with `wgpu::Features::SHADER_F16`
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
        check_alive(device)?;
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
        let AdapterTraits {
            device_type,
            subgroup_max_size,
        } = adapter_traits(device);
        let workgroup_size = workgroup_size(&limits, device_type)?;
        let stream_workgroup_size = match device_type {
            wgpu::DeviceType::Cpu if subgroup_max_size <= NARROW_SUBGROUP => {
                NARROW_CPU_STREAM_WORKGROUP_SIZE
            }
            wgpu::DeviceType::Cpu => CPU_STREAM_WORKGROUP_SIZE,
            _ => workgroup_size,
        }
        .min(workgroup_size);
        let (chunk_elements, team) = match device_type {
            wgpu::DeviceType::Cpu => (shaders::CPU_CHUNK_ELEMENTS, shaders::CPU_TEAM),
            _ => (shaders::MIN_CHUNK_ELEMENTS, shaders::GPU_TEAM),
        };
        // GPUs skip a branch no thread takes and want the parallelism.
        let tensors_per_invocation = match device_type {
            wgpu::DeviceType::Cpu if subgroup_max_size <= NARROW_SUBGROUP => {
                shaders::TENSOR_STAT_BLOCK
            }
            wgpu::DeviceType::Cpu => CPU_TENSORS_PER_INVOCATION,
            _ => 1,
        };

        let catch = Catch::begin(device);
        let entries = [
            storage_entry(0, false), // grads (one binding window, any element type)
            storage_entry(1, true),  // plan table
            storage_entry(2, false), // partials
            wgpu::BindGroupLayoutEntry {
                // stats: clip state, total partial, scaler, log, at least one tensor's stat
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: wgpu::BufferSize::new(
                        STATS_HEAD_SIZE + size_of::<TensorStat>() as u64,
                    ),
                },
                ..storage_entry(3, false)
            },
            uniform_entry::<WindowInfo>(4),
            uniform_entry::<ClipConfig>(5),
            // finalize's copy of the scale pass's indirect arguments
            wgpu::BindGroupLayoutEntry {
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: wgpu::BufferSize::new(DISPATCH_SIZE),
                },
                ..storage_entry(6, false)
            },
        ];
        let bind_group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("gradclip bind group layout"),
            entries: &entries,
        });
        // The scale and clamp passes bind all but the indirect arguments: a
        // dispatch may not read its arguments from a buffer it can write.
        let stream_bind_group_layout =
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("gradclip stream bind group layout"),
                entries: &entries[..6],
            });
        let probe_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("gradclip device probe layout"),
            entries: &[storage_entry(0, true)],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("gradclip pipeline layout"),
            bind_group_layouts: &[Some(&bind_group_layout)],
            immediate_size: 0,
        });
        let stream_pipeline_layout =
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("gradclip stream pipeline layout"),
                bind_group_layouts: &[Some(&stream_bind_group_layout)],
                immediate_size: 0,
            });
        let pipelines = Pipelines {
            module: create_module(device, &shaders::FINALIZE),
            finalize: Default::default(),
            finish: Default::default(),
            tensor_stats: Default::default(),
            long_tensor_stats: Default::default(),
        };
        catch.end()?;
        Ok(Self {
            inner: Arc::new(Inner {
                device: device.clone(),
                queue: queue.clone(),
                bind_group_layout,
                stream_bind_group_layout,
                probe_layout,
                pipeline_layout,
                stream_pipeline_layout,
                pipelines,
                uploads: Uploads::new(device),
                element_pipelines: Default::default(),
                f16_path: if native_f16 {
                    ElementPath::F16Native
                } else {
                    ElementPath::F16Packed
                },
                workgroup_size,
                stream_workgroup_size,
                chunk_elements,
                team,
                tensors_per_invocation,
            }),
        })
    }

    /// The path f16 gradients take on this clipper: [`ElementPath::F16Native`]
    /// with `SHADER_F16`, [`ElementPath::F16Packed`] without it (GL, WebGPU
    /// without `shader-f16`) or when made with [`without_shader_f16`](Self::without_shader_f16).
    pub fn f16_path(&self) -> ElementPath {
        self.inner.f16_path
    }

    /// Invocations per workgroup of every pass on this device: the largest
    /// power of two up to 256 that the limits allow, or 32 on a CPU adapter
    /// (lavapipe, llvmpipe, SwiftShader), where each barrier costs a switch
    /// per SIMD group. The order of the sums follows it, so results repeat
    /// bit for bit on one adapter, not between adapters of different types.
    /// (On CPU adapters the scale and clamp passes, which have no barrier
    /// and sum nothing, take 16 invocations, or 4 where subgroups are 4
    /// lanes wide.)
    pub fn workgroup_size(&self) -> u32 {
        self.inner.workgroup_size
    }

    /// The device the pipelines were made on.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }
}

impl Inner {
    /// Fails with [`Error::ForeignDevice`] when `buffer` (with `STORAGE`
    /// usage, checked by the caller) belongs to another device of the same
    /// instance: natively, a 4-byte bind group of it on this device is made
    /// inside error scopes, where the device is the only thing left to fail.
    /// In the browser error scopes resolve asynchronously: wgpu reports a
    /// foreign buffer at bind instead. (Objects of another wgpu `Instance`
    /// make wgpu-core panic before any validation; that cannot be caught.)
    pub fn check_owns(&self, buffer: &wgpu::Buffer, what: &'static str) -> Result<()> {
        let catch = Catch::begin(&self.device);
        // Made and dropped at once: only the validation matters.
        let _ = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("gradclip device probe"),
            layout: &self.probe_layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(4),
                }),
            }],
        });
        catch.end().map_err(|_| Error::ForeignDevice { what })
    }

    /// The path a window of `dtype` binding `bytes` takes on this clipper:
    /// f32 windows load whole 16-byte quads where the binding holds a whole
    /// number of them.
    pub fn path_of(&self, dtype: GradType, bytes: u64) -> ElementPath {
        match dtype {
            GradType::F32 if bytes.is_multiple_of(16) => ElementPath::F32,
            GradType::F32 => ElementPath::F32Unaligned,
            GradType::F16 => self.f16_path,
            GradType::Bf16 => ElementPath::Bf16Packed,
        }
    }

    /// The modules of `path`, made on first use (errors caught and returned).
    pub fn element_pipelines(&self, path: ElementPath) -> Result<Arc<ElementPipelines>> {
        let mut cache = lock(&self.element_pipelines);
        if let Some(made) = &cache[path.index()] {
            return Ok(made.clone());
        }
        let catch = Catch::begin(&self.device);
        let (reduce, scale) = shaders::element_modules(path);
        let made = ElementPipelines {
            path,
            reduce_module: create_module(&self.device, &reduce),
            scale_module: create_module(&self.device, &scale),
            reduce: Default::default(),
            scale: Default::default(),
            clamp: Default::default(),
        };
        catch.end()?;
        let made = Arc::new(made);
        cache[path.index()] = Some(made.clone());
        Ok(made)
    }

    /// The pipeline in `cell`, compiled from `entry` of `module` the first
    /// time it is asked for (errors caught and returned). Two threads asking
    /// at once may both compile it; one copy is kept.
    fn lazy<'a>(
        &self,
        cell: &'a Lazy,
        module: (&PassModule, &wgpu::ShaderModule),
        entry: &str,
        specialised: Specialised,
    ) -> Result<&'a wgpu::ComputePipeline> {
        if let Some(made) = cell.get() {
            return Ok(made);
        }
        let catch = Catch::begin(&self.device);
        let layout = match specialised {
            Specialised::Stream => &self.stream_pipeline_layout,
            _ => &self.pipeline_layout,
        };
        let made = make_pipeline(
            &self.device,
            layout,
            module,
            entry,
            (
                match specialised {
                    Specialised::Stream => self.stream_workgroup_size,
                    _ => self.workgroup_size,
                },
                self.chunk_elements,
                self.team,
            ),
            specialised,
        );
        catch.end()?;
        Ok(cell.get_or_init(|| made))
    }

    /// The reduce pipeline of `elem`'s path for `r`; with the per-segment
    /// partials of per-tensor results when `per_tensor`, for a set whose
    /// flat chunks hold tensor boundaries when `set.shared_chunks`. Where no
    /// chunk does, each segment's partial is its chunk's, and the pipeline
    /// leaves the tracked walk out (`TRACK` off): CPU drivers run a branch
    /// no lane takes under a lane mask, and with the tracked walk beside it
    /// a one-tensor set's per-tensor step cost 5-15% more on lavapipe (L2,
    /// no-clip, against a plain step: 1.11-1.15x with it, 1.04-1.06x
    /// without). The rest of `set`'s traits ([`ReduceNeeds`]) turn on the
    /// other overrides for the same reason only where the set needs them.
    pub fn reduce<'a>(
        &self,
        elem: &'a ElementPipelines,
        r: Reduction,
        per_tensor: bool,
        set: ReduceNeeds,
    ) -> Result<&'a wgpu::ComputePipeline> {
        let module = (&shaders::element_modules(elem.path).0, &elem.reduce_module);
        let track = per_tensor && set.shared_chunks;
        let fuse = track && set.fused;
        let segments = !fuse || set.segments;
        let lists = track && set.fold_lists && segments;
        // Where every chunk is tracked, none has a unit run and none needs
        // the lists: cells 7 and 8 have neither.
        let untracked = !track || set.untracked;
        let (index, entry) = match (per_tensor, track) {
            (false, _) => (0, "reduce"),
            (true, false) => (1, "reduce_tensors"),
            (true, true) if !segments => (6, "reduce_tensors"),
            (true, true) if !untracked => (7 + usize::from(fuse), "reduce_tensors"),
            (true, true) => (
                2 + usize::from(fuse) + 2 * usize::from(lists),
                "reduce_tensors",
            ),
        };
        let cell = &elem.reduce[index][r.reduce_variant()];
        let overrides = Overrides {
            track,
            fuse,
            lists: lists && untracked,
            segments,
            untracked,
        };
        self.lazy(cell, module, entry, Specialised::Reduce(r, overrides))
    }

    /// The scale pipeline of `elem`'s path.
    pub fn scale<'a>(&self, elem: &'a ElementPipelines) -> Result<&'a wgpu::ComputePipeline> {
        let module = (&shaders::element_modules(elem.path).1, &elem.scale_module);
        self.lazy(&elem.scale, module, "scale", Specialised::Stream)
    }

    /// The value-clipping pipeline of `elem`'s path.
    pub fn clamp<'a>(&self, elem: &'a ElementPipelines) -> Result<&'a wgpu::ComputePipeline> {
        let module = (&shaders::element_modules(elem.path).1, &elem.scale_module);
        self.lazy(&elem.clamp, module, "clamp_values", Specialised::Stream)
    }

    /// The finalize pipeline for `r` (from the reduce's partials).
    pub fn finalize(&self, r: Reduction) -> Result<&wgpu::ComputePipeline> {
        self.finalize_module(&self.pipelines.finalize, "finalize", r)
    }

    /// The finalize pipeline for `r` from a supplied total.
    pub fn finish(&self, r: Reduction) -> Result<&wgpu::ComputePipeline> {
        self.finalize_module(&self.pipelines.finish, "finish_supplied", r)
    }

    /// The per-tensor statistics pipeline for `r`.
    pub fn tensor_stats(&self, r: Reduction) -> Result<&wgpu::ComputePipeline> {
        self.finalize_module(&self.pipelines.tensor_stats, "tensor_stats", r)
    }

    /// The per-tensor statistics pipeline for `r`'s long tensors, a
    /// workgroup each.
    pub fn long_tensor_stats(&self, r: Reduction) -> Result<&wgpu::ComputePipeline> {
        self.finalize_module(&self.pipelines.long_tensor_stats, "long_tensor_stats", r)
    }

    /// Entry point `entry` of the finalize module for `r`, from its cells.
    fn finalize_module<'a>(
        &'a self,
        cells: &'a [Lazy; Reduction::COUNT],
        entry: &str,
        r: Reduction,
    ) -> Result<&'a wgpu::ComputePipeline> {
        let module = (&shaders::FINALIZE, &self.pipelines.module);
        self.lazy(
            &cells[r.kind() as usize],
            module,
            entry,
            Specialised::Kind(r),
        )
    }
}

/// What a pipeline is specialised for beside the device's sizes.
#[derive(Clone, Copy)]
enum Specialised {
    /// A pass that streams the gradients and sums nothing (scale, clamp):
    /// the stream workgroup size.
    Stream,
    /// A finalize-module pipeline: the `KIND` override.
    Kind(Reduction),
    /// A reduce pipeline: `KIND`, and the reduce module's own `POWER` and
    /// the rest.
    Reduce(Reduction, Overrides),
}

/// The reduce module's boolean overrides: `TRACK`, `FUSE`, `FOLD_LISTS`,
/// `SEGMENTS`, `UNTRACKED`.
#[derive(Clone, Copy)]
struct Overrides {
    track: bool,
    fuse: bool,
    lists: bool,
    segments: bool,
    untracked: bool,
}

/// What a set's layout asks of its per-tensor reduce pipeline
/// ([`Clipper::reduce`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReduceNeeds {
    /// Some flat chunk holds a tensor boundary (`TRACK`).
    pub shared_chunks: bool,
    /// Some tensors are fused (`FUSE`); a set with fused tensors has
    /// shared chunks.
    pub fused: bool,
    /// The reduction needs the per-segment fold's lists (`FOLD_LISTS`).
    pub fold_lists: bool,
    /// Some flat chunk of several segments has one outside its unit run
    /// (`SEGMENTS`; off only with fused tensors).
    pub segments: bool,
    /// Some flat chunk is walked untracked (`UNTRACKED`; off only where
    /// every chunk has several segments).
    pub untracked: bool,
}

/// The pipeline of `entry` in `module`, specialised through its overrides.
fn make_pipeline(
    device: &wgpu::Device,
    layout: &wgpu::PipelineLayout,
    (module, shader): (&PassModule, &wgpu::ShaderModule),
    entry: &str,
    (workgroup_size, chunk_elements, team): (u32, u32, u32),
    specialised: Specialised,
) -> wgpu::ComputePipeline {
    let mut constants = vec![
        (shaders::WORKGROUP_SIZE_OVERRIDE, workgroup_size as f64),
        (shaders::CHUNK_OVERRIDE, chunk_elements as f64),
        (shaders::TEAM_OVERRIDE, team as f64),
    ];
    let mut label = format!("{} {entry}", module.name);
    if let Specialised::Kind(r) | Specialised::Reduce(r, _) = specialised {
        constants.push((shaders::KIND_OVERRIDE, r.kind() as f64));
        label = format!("{label} {r:?}");
    }
    if let Specialised::Reduce(r, o) = specialised {
        constants.push((shaders::POWER_OVERRIDE, r.power() as f64));
        for (name, on, what) in [
            (shaders::TRACK_OVERRIDE, o.track, "tracked"),
            (shaders::FUSE_OVERRIDE, o.fuse, "fused"),
            (shaders::FOLD_LISTS_OVERRIDE, o.lists, "lists"),
        ] {
            constants.push((name, f64::from(u8::from(on))));
            if on {
                label = format!("{label} {what}");
            }
        }
        constants.push((shaders::SEGMENTS_OVERRIDE, f64::from(u8::from(o.segments))));
        if !o.segments {
            label = format!("{label} units only");
        }
        constants.push((
            shaders::UNTRACKED_OVERRIDE,
            f64::from(u8::from(o.untracked)),
        ));
        if !o.untracked {
            label = format!("{label} tracked only");
        }
    }
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&label),
        layout: Some(layout),
        module: shader,
        entry_point: Some(entry),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &constants,
            zero_initialize_workgroup_memory: false,
        },
        cache: None,
    })
}

fn create_module(device: &wgpu::Device, module: &PassModule) -> wgpu::ShaderModule {
    device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(module.name),
        source: wgpu::ShaderSource::Wgsl(module.source().into()),
    })
}
