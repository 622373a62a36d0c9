//! The rooflines (`roofline.wgsl`, `roofline_scalar.wgsl`): a read-only sum
//! and an in-place multiply, the simplest kernels that move a clip's bytes,
//! a sum of powers, the simplest reduce a general p can have, and the read
//! writing one 16-byte record per tensor, the simplest reduce with
//! per-tensor results.
//! Their loop shape (load width, accumulators, workgroup size and count,
//! walk) is a [`Shape`]; the bench times several and keeps the fastest.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::Res;

/// Most workgroups a shape dispatches (the partials buffer's length).
pub const MAX_WORKGROUPS: u32 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    /// One `vec4<f32>` load per element of the walk.
    Vec4,
    /// Four `f32` loads from an `array<f32>` per element of the walk.
    Scalar4,
    /// One `f32` load per element of the walk.
    Scalar1,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Vec4 => "vec4",
            Load::Scalar4 => "scalar4",
            Load::Scalar1 => "scalar1",
        }
    }
}

/// How a shape's invocations share the buffer (the kernels' WALK override).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Walk {
    /// Grid stride: neighbouring invocations read neighbouring elements.
    Grid,
    /// Each workgroup strides through its own contiguous block.
    Blocked,
    /// Each invocation reads its own contiguous run.
    Invocation,
    /// Teams of 4, 8 or 32 neighbouring invocations stride through their
    /// own contiguous run.
    Team4,
    Team8,
    Team32,
}

impl Walk {
    pub fn name(self) -> &'static str {
        match self {
            Walk::Grid => "grid",
            Walk::Blocked => "blocked",
            Walk::Invocation => "invocation",
            Walk::Team4 => "team4",
            Walk::Team8 => "team8",
            Walk::Team32 => "team32",
        }
    }

    /// The kernels' (WALK, TEAM) overrides.
    pub fn constants(self) -> [(&'static str, f64); 2] {
        let (walk, team) = match self {
            Walk::Grid => (0, 1),
            Walk::Blocked => (1, 1),
            Walk::Invocation => (2, 1),
            Walk::Team4 => (3, 4),
            Walk::Team8 => (3, 8),
            Walk::Team32 => (3, 32),
        };
        [("WALK", walk as f64), ("TEAM", team as f64)]
    }

    /// Invocations per team (1 outside team walks).
    pub fn team(self) -> u32 {
        self.constants()[1].1 as u32
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Sums the buffer: 16 bytes read per vec4.
    Read,
    /// Multiplies it in place: 16 bytes read and 16 written per vec4.
    Multiply,
    /// Sums |x|^p over the buffer (vec4 loads only): the read's 16 bytes
    /// per vec4, with a pow per element.
    Power,
    /// Sums the buffer and writes one 16-byte record per tensor (vec4 loads
    /// only): the read's 16 bytes per vec4, plus 16 written per record.
    Records,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Multiply => "multiply",
            Kind::Power => "power",
            Kind::Records => "records",
        }
    }
}

/// One loop shape of a roofline kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Shape {
    pub load: Load,
    /// Independent accumulators (read) or loads in flight (multiply) per
    /// invocation; the records kernel's record stores per iteration too.
    pub acc: u32,
    pub workgroup_size: u32,
    /// Workgroups dispatched (the walk covers the buffer whatever their count).
    pub workgroups: u32,
    pub walk: Walk,
}

impl Shape {
    /// e.g. "vec4 acc4 wg256 x1024 grid".
    pub fn label(&self) -> String {
        format!(
            "{} acc{} wg{} x{} {}",
            self.load.name(),
            self.acc,
            self.workgroup_size,
            self.workgroups,
            self.walk.name()
        )
    }

    fn entry_point(&self, kind: Kind) -> String {
        // The power and records rooflines are the read kernel with its POW
        // or RECORDS override set.
        let prefix = match kind {
            Kind::Read | Kind::Power | Kind::Records => "read",
            Kind::Multiply => "mul",
        };
        format!("{prefix}_{}", self.load.name())
    }
}

/// What a pipeline depends on: the shape without its workgroup count.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PipelineKey {
    kind: Kind,
    load: Load,
    acc: u32,
    workgroup_size: u32,
    walk: Walk,
    checked: bool,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    len4: u32,
    len1: u32,
    factor: f32,
    p: f32,
    records: u32,
    /// A uniform's size is a multiple of 16 bytes.
    pad: [u32; 3],
}

/// The shader modules and layouts, made once per device; pipelines are
/// made on first use of a shape and kept.
pub struct Rooflines {
    device: wgpu::Device,
    queue: wgpu::Queue,
    read_layout: wgpu::BindGroupLayout,
    mul_layout: wgpu::BindGroupLayout,
    read_pipeline_layout: wgpu::PipelineLayout,
    mul_pipeline_layout: wgpu::PipelineLayout,
    vec4: wgpu::ShaderModule,
    scalar: wgpu::ShaderModule,
    /// The same modules without naga's bounds checks and loop bounding,
    /// for the sweep's "what do the runtime checks cost" row.
    vec4_unchecked: wgpu::ShaderModule,
    scalar_unchecked: wgpu::ShaderModule,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
}

/// One buffer bound for the rooflines.
pub struct RooflineSet {
    read: wgpu::BindGroup,
    mul: wgpu::BindGroup,
    params: wgpu::Buffer,
    partials: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// What the records kernel writes (every read pipeline binds it).
    records_buffer: wgpu::Buffer,
    /// Records the buffer holds.
    pub records_capacity: u32,
    /// Records the records kernel writes now ([`Rooflines::set_records`]).
    records: Cell<u32>,
    /// vec4 elements covered; the last `n % 4` elements are not.
    pub len4: u64,
}

impl RooflineSet {
    /// Bytes one run of `kind` moves (the records kernel's at the record
    /// count set last).
    pub fn bytes(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Read | Kind::Power => 16 * self.len4,
            Kind::Multiply => 32 * self.len4,
            Kind::Records => 16 * self.len4 + 16 * self.records.get() as u64,
        }
    }

    /// Records the records kernel writes now.
    pub fn records(&self) -> u32 {
        self.records.get()
    }
}

pub fn storage(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
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

pub fn uniform(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// Runs `f` inside a validation error scope: a wgpu error becomes an `Err`.
pub fn checked<T>(device: &wgpu::Device, what: &str, f: impl FnOnce() -> T) -> Res<T> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    match pollster::block_on(scope.pop()) {
        None => Ok(value),
        Some(e) => Err(format!("{what}: {e}").into()),
    }
}

impl Rooflines {
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Res<Self> {
        checked(device, "roofline shaders", || {
            // The read kernels bind the buffer read-only, the multiply
            // kernels read-write: one layout each, since a bind group may
            // not hold the same buffer both ways. Every read has the
            // records' binding: vec4's declares it, RECORDS or not.
            let read_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("roofline read layout"),
                entries: &[
                    storage(0, true),
                    storage(2, false),
                    uniform(3),
                    storage(4, false),
                ],
            });
            let mul_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("roofline multiply layout"),
                entries: &[storage(1, false), uniform(3)],
            });
            let pipeline_layout = |label, layout| {
                device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some(label),
                    bind_group_layouts: &[Some(layout)],
                    immediate_size: 0,
                })
            };
            let module = |label, source: &'static str, checks: bool| {
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(label),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                };
                if checks {
                    device.create_shader_module(desc)
                } else {
                    // SAFETY: every index the kernels form is below the
                    // length they are given, which the bound buffer holds
                    // (RooflineSet binds 16 len4 bytes, and set_records
                    // keeps the record count within the records buffer),
                    // and every loop ends; validated against a float64 sum
                    // (and every record read back) before timing.
                    unsafe {
                        device.create_shader_module_trusted(
                            desc,
                            wgpu::ShaderRuntimeChecks::unchecked(),
                        )
                    }
                }
            };
            let vec4 = include_str!("roofline.wgsl");
            let scalar = include_str!("roofline_scalar.wgsl");
            Self {
                read_pipeline_layout: pipeline_layout(
                    "roofline read pipeline layout",
                    &read_layout,
                ),
                mul_pipeline_layout: pipeline_layout(
                    "roofline multiply pipeline layout",
                    &mul_layout,
                ),
                read_layout,
                mul_layout,
                vec4: module("roofline.wgsl", vec4, true),
                scalar: module("roofline_scalar.wgsl", scalar, true),
                vec4_unchecked: module("roofline.wgsl (unchecked)", vec4, false),
                scalar_unchecked: module("roofline_scalar.wgsl (unchecked)", scalar, false),
                pipelines: Mutex::new(HashMap::new()),
                device: device.clone(),
                queue: queue.clone(),
            }
        })
    }

    /// Whether `kind` has a kernel with `shape`'s loads (the power and
    /// records kernels load vec4 only).
    pub fn has(kind: Kind, shape: &Shape) -> bool {
        !matches!(kind, Kind::Power | Kind::Records) || shape.load == Load::Vec4
    }

    /// Whether `shape` can run on this device.
    pub fn supports(&self, shape: &Shape) -> bool {
        let l = self.device.limits();
        shape.workgroup_size.is_power_of_two()
            && shape.workgroup_size <= l.max_compute_invocations_per_workgroup
            && shape.workgroup_size <= l.max_compute_workgroup_size_x
            && shape.workgroup_size * 4 <= l.max_compute_workgroup_storage_size
            && (1..=MAX_WORKGROUPS.min(l.max_compute_workgroups_per_dimension))
                .contains(&shape.workgroups)
            && [1, 2, 4, 8].contains(&shape.acc)
            && shape.workgroup_size.is_multiple_of(shape.walk.team())
    }

    /// Whether a buffer of `n` f32 elements can be bound whole.
    pub fn fits(device: &wgpu::Device, n: u64) -> bool {
        n >= 4 && n * 4 <= device.limits().max_storage_buffer_binding_size && n <= u32::MAX as u64
    }

    /// Whether a records buffer of `records` 16-byte records can be bound whole.
    pub fn fits_records(device: &wgpu::Device, records: u64) -> bool {
        let l = device.limits();
        records * 16 <= l.max_storage_buffer_binding_size.min(l.max_buffer_size)
            && records < u32::MAX as u64
    }

    fn pipeline(
        &self,
        kind: Kind,
        shape: &Shape,
        checked_module: bool,
    ) -> Res<wgpu::ComputePipeline> {
        let key = PipelineKey {
            kind,
            load: shape.load,
            acc: shape.acc,
            workgroup_size: shape.workgroup_size,
            walk: shape.walk,
            checked: checked_module,
        };
        if let Some(p) = self.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let module = match (shape.load, checked_module) {
            (Load::Vec4, true) => &self.vec4,
            (Load::Vec4, false) => &self.vec4_unchecked,
            (_, true) => &self.scalar,
            (_, false) => &self.scalar_unchecked,
        };
        if !Self::has(kind, shape) {
            return Err(format!(
                "no {} roofline with {} loads",
                kind.name(),
                shape.load.name()
            )
            .into());
        }
        let layout = match kind {
            Kind::Read | Kind::Power | Kind::Records => &self.read_pipeline_layout,
            Kind::Multiply => &self.mul_pipeline_layout,
        };
        let label = format!("roofline {} {}", kind.name(), shape.label());
        let entry = shape.entry_point(kind);
        let mut constants = vec![
            ("WG", shape.workgroup_size as f64),
            ("ACC", shape.acc as f64),
            shape.walk.constants()[0],
            shape.walk.constants()[1],
        ];
        // Only the vec4 module declares POW and RECORDS, and only its read
        // uses them.
        match kind {
            Kind::Power => constants.push(("POW", 1.0)),
            Kind::Records => constants.push(("RECORDS", 1.0)),
            Kind::Read | Kind::Multiply => {}
        }
        let pipeline = checked(&self.device, &label, || {
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: Some(layout),
                    module,
                    entry_point: Some(&entry),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &constants,
                        ..Default::default()
                    },
                    cache: None,
                })
        })?;
        self.pipelines.lock().unwrap().insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// Makes the pipelines of `shapes` now, so that no timed loop compiles.
    pub fn prepare(&self, kind: Kind, shapes: &[Shape], checked_module: bool) -> Res<()> {
        for s in shapes {
            self.pipeline(kind, s, checked_module)?;
        }
        Ok(())
    }

    /// Binds the first `4 (n / 4)` floats of `grads` (at least `4 n` bytes),
    /// with a records buffer of `records_capacity` records (at least one:
    /// the read pipelines bind it whether they write it or not).
    pub fn bind(&self, grads: &wgpu::Buffer, n: u64, records_capacity: u32) -> RooflineSet {
        let device = &self.device;
        let len4 = n / 4;
        let records_capacity = records_capacity.max(1);
        let records_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("roofline records"),
            size: 16 * records_capacity as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("roofline params"),
            size: size_of::<Params>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let partials = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("roofline partials"),
            size: MAX_WORKGROUPS as u64 * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("roofline partials readback"),
            size: MAX_WORKGROUPS as u64 * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let grads_binding = || {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: grads,
                offset: 0,
                size: wgpu::BufferSize::new(16 * len4),
            })
        };
        let read = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("roofline read bind group"),
            layout: &self.read_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: grads_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: partials.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: records_buffer.as_entire_binding(),
                },
            ],
        });
        let mul = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("roofline multiply bind group"),
            layout: &self.mul_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: grads_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: params.as_entire_binding(),
                },
            ],
        });
        let set = RooflineSet {
            read,
            mul,
            params,
            partials,
            readback,
            records_buffer,
            records_capacity,
            records: Cell::new(0),
            len4,
        };
        let params = Params {
            len4: len4 as u32,
            len1: 4 * len4 as u32,
            factor: 1.0,
            p: 1.0,
            records: 0,
            pad: [0; 3],
        };
        self.queue
            .write_buffer(&set.params, 0, bytemuck::bytes_of(&params));
        set
    }

    /// The multiply kernel's constant (a queue write: outside timed loops).
    /// Timed runs multiply by 1, which no driver can know from a uniform.
    pub fn set_factor(&self, set: &RooflineSet, factor: f32) {
        self.queue.write_buffer(
            &set.params,
            std::mem::offset_of!(Params, factor) as u64,
            bytemuck::bytes_of(&factor),
        );
    }

    /// The power kernel's exponent (a queue write: outside timed loops).
    pub fn set_power(&self, set: &RooflineSet, p: f32) {
        self.queue.write_buffer(
            &set.params,
            std::mem::offset_of!(Params, p) as u64,
            bytemuck::bytes_of(&p),
        );
    }

    /// The records kernel's record count, at most the set's capacity (a
    /// queue write: outside timed loops).
    pub fn set_records(&self, set: &RooflineSet, records: u32) -> Res<()> {
        if records > set.records_capacity {
            return Err(format!(
                "{records} roofline records where the buffer holds {}",
                set.records_capacity
            )
            .into());
        }
        set.records.set(records);
        self.queue.write_buffer(
            &set.params,
            std::mem::offset_of!(Params, records) as u64,
            bytemuck::bytes_of(&records),
        );
        Ok(())
    }

    /// Records one run of `kind` with `shape` into `pass`. The pipeline must
    /// have been made by [`prepare`](Self::prepare) or an earlier record.
    pub fn record(
        &self,
        set: &RooflineSet,
        pass: &mut wgpu::ComputePass,
        kind: Kind,
        shape: &Shape,
        checked_module: bool,
    ) -> Res<()> {
        let pipeline = self.pipeline(kind, shape, checked_module)?;
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(
            0,
            match kind {
                Kind::Read | Kind::Power | Kind::Records => &set.read,
                Kind::Multiply => &set.mul,
            },
            &[],
        );
        pass.dispatch_workgroups(shape.workgroups, 1, 1);
        Ok(())
    }

    /// Runs `kind` with `shape` once, untimed, and waits.
    fn run_once(
        &self,
        set: &RooflineSet,
        kind: Kind,
        shape: &Shape,
        checked_module: bool,
    ) -> Res<()> {
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("roofline check"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("roofline check"),
                timestamp_writes: None,
            });
            self.record(set, &mut pass, kind, shape, checked_module)?;
        }
        self.queue.submit([enc.finish()]);
        self.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok(())
    }

    /// The float64 sum of the partials a read (power, records) with `shape` wrote.
    fn sum_of(
        &self,
        set: &RooflineSet,
        kind: Kind,
        shape: &Shape,
        checked_module: bool,
    ) -> Res<f64> {
        self.run_once(set, kind, shape, checked_module)?;
        let bytes = shape.workgroups as u64 * 4;
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("roofline partials readback"),
            });
        enc.copy_buffer_to_buffer(&set.partials, 0, &set.readback, 0, bytes);
        self.queue.submit([enc.finish()]);
        let data = crate::read_mapped(&self.device, &set.readback)?;
        Ok(bytemuck::cast_slice::<u8, f32>(&data[..bytes as usize])
            .iter()
            .map(|&p| p as f64)
            .sum())
    }

    /// Checks every shape on a buffer of ones (the caller fills the bound
    /// buffer with 1.0 first and restores it after): each read shape must
    /// sum to the element count, each multiply shape must double every
    /// element (read back by the first read shape) and halve it again, and
    /// each power shape must sum to the element count too (1^p is 1, to
    /// within pow's rounding), and each records shape must sum to it and
    /// write every one of the set's current record count (read back from a
    /// buffer filled with NaN words first), none past it. A shape that skips
    /// or repeats elements, or skips records, fails here, before any timing.
    pub fn validate(
        &self,
        set: &RooflineSet,
        reads: &[Shape],
        muls: &[Shape],
        powers: &[Shape],
        records: &[Shape],
        checked_module: bool,
    ) -> Res<()> {
        let elements = 4.0 * set.len4 as f64;
        let reference = reads.first().copied().unwrap_or(Shape {
            load: Load::Vec4,
            acc: 1,
            workgroup_size: 64,
            workgroups: 64,
            walk: Walk::Grid,
        });
        // Integer-valued float sums are exact while each partial stays
        // below 2^24; above that, rounding is allowed for, nothing else.
        let tolerance = |shape: &Shape, value: f64| {
            if value / shape.workgroups as f64 * 2.0 < (1u64 << 24) as f64 {
                0.0
            } else {
                1e-6 * value
            }
        };
        let check = |what: &str, shape: &Shape, got: f64, want: f64, tol: f64| {
            if (got - want).abs() > tol {
                Err(format!(
                    "roofline {what} {} wrong: sum {got} where {want} was expected",
                    shape.label()
                ))
            } else {
                Ok(())
            }
        };
        for s in reads {
            let sum = self.sum_of(set, Kind::Read, s, checked_module)?;
            check("read", s, sum, elements, tolerance(s, elements))?;
        }
        for s in powers {
            // A driver's pow of 1 may be off by an ulp or two.
            let sum = self.sum_of(set, Kind::Power, s, checked_module)?;
            check("power", s, sum, elements, 1e-5 * elements)?;
        }
        if !records.is_empty() {
            self.validate_records(set, records, checked_module, |s, sum| {
                check("records", s, sum, elements, tolerance(s, elements))
            })?;
        }
        for s in muls {
            self.set_factor(set, 2.0);
            self.run_once(set, Kind::Multiply, s, checked_module)?;
            let doubled = self.sum_of(set, Kind::Read, &reference, checked_module)?;
            self.set_factor(set, 0.5);
            self.run_once(set, Kind::Multiply, s, checked_module)?;
            let restored = self.sum_of(set, Kind::Read, &reference, checked_module)?;
            check(
                "multiply",
                s,
                doubled,
                2.0 * elements,
                tolerance(&reference, 2.0 * elements),
            )?;
            check(
                "multiply",
                s,
                restored,
                elements,
                tolerance(&reference, elements),
            )?;
        }
        self.set_factor(set, 1.0);
        Ok(())
    }

    /// The records half of [`validate`](Self::validate): per shape, fills
    /// the records buffer with 0xffffffff words (a NaN in x, no record's
    /// index in y), runs the records kernel, checks its sum with
    /// `check_sum`, and reads every record back: records below the count
    /// must be (bits of a finite sum, r, 0, 0), those past it untouched.
    fn validate_records(
        &self,
        set: &RooflineSet,
        shapes: &[Shape],
        checked_module: bool,
        check_sum: impl Fn(&Shape, f64) -> Result<(), String>,
    ) -> Res<()> {
        let count = set.records();
        let bytes = 16 * set.records_capacity as u64;
        let unwritten = vec![u32::MAX; 4 * set.records_capacity as usize];
        let readback = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("roofline records readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for s in shapes {
            self.queue
                .write_buffer(&set.records_buffer, 0, bytemuck::cast_slice(&unwritten));
            let sum = self.sum_of(set, Kind::Records, s, checked_module)?;
            check_sum(s, sum)?;
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("roofline records readback"),
                });
            enc.copy_buffer_to_buffer(&set.records_buffer, 0, &readback, 0, bytes);
            self.queue.submit([enc.finish()]);
            let data = crate::read_mapped(&self.device, &readback)?;
            let words: &[u32] = bytemuck::cast_slice(&data);
            for (r, w) in words.chunks_exact(4).enumerate() {
                let ok = if r < count as usize {
                    let x = f32::from_bits(w[0]);
                    x.is_finite() && x >= 0.0 && w[1] == r as u32 && w[2] == 0 && w[3] == 0
                } else {
                    w.iter().all(|&v| v == u32::MAX)
                };
                if !ok {
                    return Err(format!(
                        "roofline records {} wrong: record {r} of {count} is {w:08x?}",
                        s.label()
                    )
                    .into());
                }
            }
        }
        Ok(())
    }
}
