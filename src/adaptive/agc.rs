//! AGC: unit-wise clipping against the parameters (`shaders/adaptive_agc.wgsl`).

use std::sync::atomic::{AtomicBool, Ordering};

use bytemuck::{Pod, Zeroable};

use crate::clipper::{storage_entry, uniform_entry};
use crate::dtype::GradType;
use crate::error::{Error, Result};
use crate::gpu_errors::{check_alive, init_buffer, Catch};
use crate::layout::GradLayout;
use crate::plan::check_recordable;
use crate::shaders;

/// Which elements of a tensor form one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgcUnits {
    /// Optax's `unitwise_norm` (JAX layouts): a tensor that squeezes to rank
    /// ≤ 1 is one unit; rank 2 and 3 (`IO`, multi-head `HIO`... as Optax
    /// reduces) reduce over axis 0; rank 4 (`HWIO`) over axes 0, 1, 2. Other
    /// ranks have no unit ([`Error::InvalidAdaptive`]), as in Optax.
    Optax,
    /// PyTorch layouts (`OI`, `OIHW`; timm's `agc.py`): rank ≤ 1 is one
    /// unit, otherwise one unit per index of axis 0.
    Torch,
}

/// AGC (Brock et al. 2021, "High-Performance Large-Scale Image Recognition
/// Without Normalization"; Optax `adaptive_grad_clip`): each unit's gradient
/// is kept where `‖g‖ < clipping · max(‖w‖, eps)`, else multiplied by
/// `clipping · max(‖w‖, eps) / max(‖g‖, 1e-6)`.
///
/// ```
/// let a = gradclip::Agc::new(0.01);
/// assert_eq!((a.clipping, a.eps), (0.01, 1e-3));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agc {
    /// λ. NFNets use 0.01 (batch 4096) to 0.16.
    pub clipping: f32,
    /// Floor of a unit's parameter norm (Optax's default 1e-3), so that
    /// zero-initialised weights still get gradients.
    pub eps: f32,
}

impl Agc {
    pub fn new(clipping: f32) -> Self {
        Self {
            clipping,
            eps: 1e-3,
        }
    }
    pub fn eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }
}

/// One unit's numbers in the latest clip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnitReport {
    pub grad_norm: f32,
    pub param_norm: f32,
    /// `clipping · max(param_norm, eps)`: the unit's threshold.
    pub max_norm: f32,
    /// What the unit's gradients were multiplied by (1: kept).
    pub factor: f32,
}

impl UnitReport {
    /// Whether the unit was scaled (Optax's `g_norm >= max_norm`).
    pub fn clipped(&self) -> bool {
        self.factor.to_bits() != 1f32.to_bits()
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct AgcParams {
    clipping: f32,
    eps: f32,
    tensors: u32,
    units: u32,
    words: u32,
    _pad: [u32; 3],
}

/// AGC over gradients and parameters of one element type (f32 with
/// [`new`](Self::new), f16 or bf16 with [`new_as`](Self::new_as)) packed
/// with the same [`GradLayout`], each tensor with its shape. Two dispatches
/// recorded into the caller's encoder: one workgroup per unit finds the
/// units' norms and factors (striding when there are more than the device's
/// per-dimension dispatch limit), then one invocation per 32-bit word of
/// gradients scales the clipped units' elements in place (16-bit results
/// rounded to nearest even). Stateless; nothing read back unless asked.
///
/// Buffers beyond one storage binding are not supported
/// ([`Error::Unsupported`]).
///
/// ```
/// # pollster::block_on(async {
/// # use wgpu::util::DeviceExt;
/// # let (device, queue, _) = gradclip::default_device().await?;
/// let buffer = |data: &[f32]| device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
///     label: None, contents: bytemuck::cast_slice(data),
///     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC });
/// // A [2, 2] dense kernel (JAX `IO`): units are the columns.
/// let params = buffer(&[3.0, 0.0, 4.0, 0.0]);
/// let grads = buffer(&[0.3, 1.0, 0.4, 1.0]);
/// let layout = gradclip::GradLayout::from_sizes(&[4])?;
/// let agc = gradclip::AgcClip::new(&device, &queue, &grads, &params, &layout,
///     &[(&[2, 2], gradclip::AgcUnits::Optax)], gradclip::Agc::new(0.1))?;
/// let mut encoder = device.create_command_encoder(&Default::default());
/// agc.clip(&mut encoder)?;
/// queue.submit([encoder.finish()]);
/// let units = agc.read_units().await?;
/// // Column 0: ‖g‖ = 0.5 ≥ 0.1 · 5, scaled by 0.5 / 0.5; column 1: zero weights, eps floor.
/// assert_eq!(units[0].max_norm, 0.5);
/// assert!(units[1].clipped() && (units[1].factor - 1e-4 / 2f32.sqrt()).abs() < 1e-9);
/// # Ok::<(), gradclip::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct AgcClip {
    device: wgpu::Device,
    queue: wgpu::Queue,
    grads: wgpu::Buffer,
    params: wgpu::Buffer,
    units: u32,
    words: u32,
    unit_stats: wgpu::Buffer,
    staging: wgpu::Buffer,
    reading: AtomicBool,
    norms: wgpu::ComputePipeline,
    scale: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
}

/// `[P, R, Q]`: unit `(p, q)` is the `R` elements `(p, 0..R, q)` at stride `Q`.
fn unit_view(shape: &[usize], units: AgcUnits) -> Result<[u64; 3]> {
    let n: u64 = shape.iter().map(|&d| d as u64).product();
    let prod = |s: &[usize]| s.iter().map(|&d| d as u64).product::<u64>();
    let rank = shape.len();
    Ok(match units {
        AgcUnits::Optax => {
            if shape.iter().filter(|&&d| d != 1).count() <= 1 {
                [1, n, 1]
            } else if rank == 2 || rank == 3 {
                [1, shape[0] as u64, prod(&shape[1..])]
            } else if rank == 4 {
                [1, prod(&shape[..3]), shape[3] as u64]
            } else {
                return Err(Error::InvalidAdaptive(
                    "Optax's unitwise_norm has no unit for tensors of rank 5 or more",
                ));
            }
        }
        AgcUnits::Torch => {
            if rank <= 1 {
                [1, n, 1]
            } else {
                [shape[0] as u64, prod(&shape[1..]), 1]
            }
        }
    })
}

/// The first `bytes` of `buffer` (at least 4: wgpu rejects empty bindings).
fn whole(buffer: &wgpu::Buffer, bytes: u64) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer,
        offset: 0,
        size: wgpu::BufferSize::new(bytes.max(4)),
    })
}

impl AgcClip {
    /// Binds `grads` and `params` (f32, `STORAGE`; the same `layout`) with
    /// one `(shape, units)` per tensor. A shape whose size is not its
    /// tensor's, or without units under its convention, is
    /// [`Error::InvalidAdaptive`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        grads: &wgpu::Buffer,
        params: &wgpu::Buffer,
        layout: &GradLayout,
        shapes: &[(&[usize], AgcUnits)],
        agc: Agc,
    ) -> Result<Self> {
        Self::new_as(
            device,
            queue,
            grads,
            params,
            layout,
            GradType::F32,
            shapes,
            agc,
        )
    }

    /// [`new`](Self::new) for gradients and parameters of `dtype`, both
    /// packed as [`Clipper::bind_as`](crate::Clipper::bind_as) packs them:
    /// tensor `i` at [`GradLayout::packed_range`]`(i, dtype)` (16-bit tensors
    /// start at even elements; the padding element after an odd-sized one is
    /// never changed). Norms and factors are computed in f32 from the exactly
    /// decoded elements; clipped elements are rounded back to nearest even.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// let bf16 = |x: &[f32]| -> Vec<u16> { x.iter().map(|v| (v.to_bits() >> 16) as u16).collect() };
    /// let buffer = |data: &[u16]| device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    ///     label: None, contents: bytemuck::cast_slice(data),
    ///     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC });
    /// // One bias vector of 4 (one unit): ‖g‖ = 1 ≥ 0.1 · ‖w‖ = 0.2, scaled by 0.2.
    /// let params = buffer(&bf16(&[1.0, 1.0, 1.0, 1.0]));
    /// let grads = buffer(&bf16(&[0.5, 0.5, 0.5, -0.5]));
    /// let layout = gradclip::GradLayout::from_sizes(&[4])?;
    /// let agc = gradclip::AgcClip::new_as(&device, &queue, &grads, &params, &layout,
    ///     gradclip::GradType::Bf16, &[(&[4], gradclip::AgcUnits::Optax)], gradclip::Agc::new(0.1))?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// agc.clip(&mut encoder)?;
    /// queue.submit([encoder.finish()]);
    /// let units = agc.read_units().await?;
    /// assert_eq!((units[0].grad_norm, units[0].max_norm), (1.0, 0.2));
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new_as(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        grads: &wgpu::Buffer,
        params: &wgpu::Buffer,
        layout: &GradLayout,
        dtype: GradType,
        shapes: &[(&[usize], AgcUnits)],
        agc: Agc,
    ) -> Result<Self> {
        if !(agc.clipping >= 0.0 && agc.clipping.is_finite()) {
            return Err(Error::InvalidAdaptive(
                "AGC clipping must be non-negative and finite",
            ));
        }
        if !(agc.eps >= 0.0 && agc.eps.is_finite()) {
            return Err(Error::InvalidAdaptive(
                "AGC eps must be non-negative and finite",
            ));
        }
        if shapes.len() != layout.len() {
            return Err(Error::InvalidAdaptive("AGC needs one shape per tensor"));
        }
        let elements = layout.packed_elements(dtype);
        // Whole words: a 16-bit buffer of an odd element count still ends on one.
        let bytes = (elements * dtype.bytes()).next_multiple_of(4);
        let limit = device.limits().max_storage_buffer_binding_size;
        for buffer in [grads, params] {
            if bytes > buffer.size() {
                return Err(Error::LayoutExceedsBuffer {
                    needed: bytes,
                    buffer_size: buffer.size(),
                });
            }
        }
        if bytes > limit || elements > u32::MAX as u64 {
            return Err(Error::Unsupported(
                "AGC over more than one storage binding of gradients",
            ));
        }
        let mut table = Vec::with_capacity(5 * shapes.len());
        let mut units = 0u64;
        for (i, &(shape, convention)) in shapes.iter().enumerate() {
            let range = layout.packed_range(i, dtype);
            let [p, r, q] = unit_view(shape, convention)?;
            if p * r * q != range.end - range.start {
                return Err(Error::InvalidAdaptive(
                    "an AGC shape whose size is not its tensor's",
                ));
            }
            table.extend([units, range.start, p, r, q].map(|w| w as u32));
            units += p * q;
        }
        if units > u32::MAX as u64 {
            return Err(Error::InvalidAdaptive("more than 2^32 AGC units"));
        }
        let units = units as u32;
        check_alive(device)?;
        let catch = Catch::begin(device);
        let agc_params = AgcParams {
            clipping: agc.clipping,
            eps: agc.eps,
            tensors: shapes.len() as u32,
            units,
            words: (bytes / 4) as u32,
            _pad: [0; 3],
        };
        let params_buffer = init_buffer(
            device,
            "gradclip agc params",
            bytemuck::bytes_of(&agc_params),
            wgpu::BufferUsages::UNIFORM,
        )?;
        let table = init_buffer(
            device,
            "gradclip agc unit table",
            bytemuck::cast_slice(&table),
            wgpu::BufferUsages::STORAGE,
        )?;
        let stats_size = 16 * units.max(1) as u64;
        let unit_stats = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip agc unit stats"),
            size: stats_size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gradclip agc unit stats readback"),
            size: stats_size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind_group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("gradclip agc bind group layout"),
            entries: &[
                storage_entry(0, false), // gradients
                storage_entry(1, true),  // parameters
                storage_entry(2, true),  // unit table
                storage_entry(3, false), // unit results
                uniform_entry::<AgcParams>(4),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("gradclip agc pipeline layout"),
            bind_group_layouts: &[Some(&bind_group_layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(shaders::ADAPTIVE_AGC.name),
            source: wgpu::ShaderSource::Wgsl(shaders::ADAPTIVE_AGC.source().into()),
        });
        let constants = [(
            shaders::AGC_DTYPE_OVERRIDE,
            crate::records::agc_dtype(dtype) as f64,
        )];
        let pipeline = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&format!("gradclip {entry}")),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    ..Default::default()
                },
                cache: None,
            })
        };
        let (norms, scale) = (pipeline("agc_norms"), pipeline("agc_scale"));
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("gradclip agc bind group"),
            layout: &bind_group_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: whole(grads, bytes),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: whole(params, bytes),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: table.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: unit_stats.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: params_buffer.as_entire_binding(),
                },
            ],
        });
        catch.end()?;
        Ok(Self {
            device: device.clone(),
            queue: queue.clone(),
            grads: grads.clone(),
            params: params.clone(),
            units,
            words: agc_params.words,
            unit_stats,
            staging,
            reading: AtomicBool::new(false),
            norms,
            scale,
            bind_group,
        })
    }

    /// Units over all tensors.
    pub fn unit_count(&self) -> u32 {
        self.units
    }

    /// Records the clip: two dispatches in one compute pass. Errors before
    /// anything is recorded: a gradient or parameter buffer mapped or destroyed.
    pub fn clip(&self, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
        check_recordable(&self.grads, "gradient buffer")?;
        check_recordable(&self.params, "parameter buffer")?;
        if self.units == 0 {
            return Ok(());
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("gradclip agc"),
            timestamp_writes: None,
        });
        // Both shaders stride by the dispatch they get, so any count within
        // the device's per-dimension limit covers everything.
        let most = self.device.limits().max_compute_workgroups_per_dimension;
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.set_pipeline(&self.norms);
        pass.dispatch_workgroups(self.units.min(most), 1, 1);
        pass.set_pipeline(&self.scale);
        pass.dispatch_workgroups(
            self.words.div_ceil(shaders::AGC_WORKGROUP_SIZE).min(most),
            1,
            1,
        );
        Ok(())
    }

    /// Every unit's norms, threshold and factor in the latest clip, units
    /// numbered tensor by tensor, `p · Q + q` within one. Waits for
    /// everything submitted so far (natively it blocks).
    pub async fn read_units(&self) -> Result<Vec<UnitReport>> {
        if self.reading.swap(true, Ordering::AcqRel) {
            return Err(Error::Readback(
                "another read of these AGC units is in flight".into(),
            ));
        }
        let bytes =
            super::read_back(&self.device, &self.queue, &self.unit_stats, &self.staging).await;
        self.reading.store(false, Ordering::Release);
        let bytes = bytes?;
        Ok(bytes
            .chunks_exact(16)
            .take(self.units as usize)
            .map(|u| {
                let f = |i: usize| f32::from_le_bytes([u[i], u[i + 1], u[i + 2], u[i + 3]]);
                UnitReport {
                    grad_norm: f(0),
                    param_norm: f(4),
                    max_norm: f(8),
                    factor: f(12),
                }
            })
            .collect())
    }
}
