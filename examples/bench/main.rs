//! gradclip benchmark: times `GradSet::clip_norm` against the adapter's own
//! copy bandwidth, a per-tensor baseline and a CPU loop, in one run.
//!
//! `cargo run --release --example bench -- --help`; docs/benchmark.md has the
//! commands, the JSON schema and the figures measured so far.

mod cpu;
mod naive;
mod plot;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde::Serialize;
use wgpu::util::DeviceExt;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Clip-step and no-clip-step floors, bytes per element: a clip reads every
/// element for the norm and reads and writes it to scale; a no-clip step
/// only reads it.
const CLIP_FLOOR_BYTES: u64 = 12;
const NOCLIP_FLOOR_BYTES: u64 = 4;
/// Smallest default size.
const MIN_N: u64 = 100_000;
/// wgpu's limit on the queries of one query set.
const MAX_QUERIES: u32 = 4096;

#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks gradclip's clip_norm on the default adapter (WGPU_BACKEND, WGPU_ADAPTER_NAME)",
    long_about = None
)]
struct Args {
    /// Largest N (f32 elements in all tensors together): sizes are the
    /// decades from 1e5 up to it, plus it. `max`: the largest buffer the
    /// adapter holds (needs 3 buffers of 4 N bytes, and 2 N floats on the host).
    #[arg(long, default_value = "1e7")]
    max_n: String,
    /// Explicit sizes instead of decades, e.g. `--sizes 1e5,3e6,2.5e7`.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<String>,
    /// Tensor counts; the N elements are split evenly among them.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 100, 10_000])]
    tensors: Vec<usize>,
    /// Norms to time.
    #[arg(long, value_delimiter = ',', default_values_t = [NormKind::L2, NormKind::Inf])]
    norms: Vec<NormKind>,
    /// Timed repetitions per case (the median is reported; at least 20).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Untimed repetitions before them.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// A short run: sizes up to 1e6, one warm-up repetition.
    #[arg(long)]
    quick: bool,
    /// Which cases the per-tensor dispatch baseline runs. It records the
    /// same dispatches and moves the same bytes for clip and no-clip steps
    /// (it always scales) and for both norms, so by default only the L2
    /// clip step is timed.
    #[arg(long, value_enum, default_value_t = NaiveCases::L2Clip)]
    naive: NaiveCases,
    /// Skip the CPU baseline.
    #[arg(long)]
    no_cpu: bool,
    /// Wall-clock time only, even where the adapter has timestamp queries.
    #[arg(long)]
    wall: bool,
    /// Fail unless the adapter is a GPU (not lavapipe, llvmpipe or another
    /// CPU adapter): for runs whose figures are meant as GPU figures.
    #[arg(long)]
    require_gpu: bool,
    /// Write the results as JSON (schema "gradclip-bench/1").
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG plot of effective GB/s against N.
    #[arg(long)]
    svg: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum NaiveCases {
    /// L2 clip steps only.
    L2Clip,
    /// Clip steps of every norm.
    Clip,
    /// Every case.
    All,
    /// None.
    None,
}

impl NaiveCases {
    fn runs(self, norm: NormKind, step: Step) -> bool {
        match self {
            NaiveCases::L2Clip => norm == NormKind::L2 && step == Step::Clip,
            NaiveCases::Clip => step == Step::Clip,
            NaiveCases::All => true,
            NaiveCases::None => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    L2,
    Inf,
}

impl std::fmt::Display for NormKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NormKind::L2 => "l2",
            NormKind::Inf => "inf",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    Clip,
    Noclip,
}

impl Step {
    fn floor_bytes(self) -> u64 {
        match self {
            Step::Clip => CLIP_FLOOR_BYTES,
            Step::Noclip => NOCLIP_FLOOR_BYTES,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Step::Clip => "clip",
            Step::Noclip => "noclip",
        }
    }
}

/// What a run measured; the PyTorch peer writes the same schema.
#[derive(Serialize)]
pub struct Run {
    schema: &'static str,
    tool: &'static str,
    date_utc: String,
    command: String,
    adapter: Adapter,
    /// "gpu": times are GPU timestamps; "wall": wall clock around submit + wait.
    basis: &'static str,
    reps: usize,
    warmup: usize,
    copy: Vec<CopyResult>,
    results: Vec<CaseResult>,
}

#[derive(Serialize)]
struct Adapter {
    name: String,
    backend: String,
    device_type: String,
    driver: String,
    driver_info: String,
    timestamp_query: bool,
    timestamp_inside_encoders: bool,
    timestamp_inside_passes: bool,
}

#[derive(Serialize, Clone)]
pub struct CopyResult {
    pub n: u64,
    /// Bytes read plus bytes written.
    pub bytes: u64,
    /// Median device copy time (on the run's basis).
    pub seconds: f64,
    pub gbps: f64,
    /// Median host `copy_from_slice` time and bandwidth (the CPU baseline's limit).
    pub host_seconds: Option<f64>,
    pub host_gbps: Option<f64>,
}

#[derive(Serialize, Clone)]
pub struct CaseResult {
    /// "gradclip", "naive" (a dispatch per tensor), "cpu" (Rust loop), "torch".
    pub implementation: String,
    pub n: u64,
    pub tensors: usize,
    pub norm: NormKind,
    pub step: Step,
    /// Bytes the step must move at least: 12 N for a clip, 4 N for a no-clip step.
    pub floor_bytes: u64,
    /// Median time on `basis` (GPU time of all passes, or wall time).
    pub seconds: f64,
    pub basis: &'static str,
    /// Fastest repetition, same basis.
    pub min_seconds: f64,
    /// Median wall time: record + submit + wait (the whole call on the CPU).
    pub wall_seconds: f64,
    /// Median host time to record the clip into an encoder (no submit).
    pub record_seconds: Option<f64>,
    /// Median GPU time of each pass, where timestamps allow.
    pub passes: BTreeMap<String, f64>,
    /// floor_bytes / seconds.
    pub gbps: f64,
    /// gbps / the copy bandwidth of the same device and N ("device copy"
    /// for GPU rows, "host copy" for the CPU baseline).
    pub copy_fraction: f64,
    pub limit: &'static str,
    pub total_norm: f32,
    pub coefficient: f32,
}

/// Reads a MAP_READ buffer whose copy was submitted.
pub fn read_mapped(device: &wgpu::Device, buffer: &wgpu::Buffer) -> Result<Vec<u8>, String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    buffer.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = sender.send(r);
    });
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;
    receiver
        .recv()
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let bytes = buffer
        .get_mapped_range(..)
        .map_err(|e| e.to_string())?
        .to_vec();
    buffer.unmap();
    Ok(bytes)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let k = v.len();
    if k == 0 {
        f64::NAN
    } else if k % 2 == 1 {
        v[k / 2]
    } else {
        0.5 * (v[k / 2 - 1] + v[k / 2])
    }
}

fn min_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn parse_count(s: &str) -> Res<u64> {
    let v: f64 = s.trim().parse()?;
    if !(v >= 1.0 && v.fract() == 0.0 && v < 1e15) {
        return Err(format!("not a positive element count: {s}").into());
    }
    Ok(v as u64)
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn date_utc() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((now / 86_400) as i64, now % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// A reproducible gradient: uniform values in [-0.01, 0.01).
fn gradient(n: usize) -> Vec<f32> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
        })
        .collect()
}

/// N split evenly into `t` tensors.
fn even_sizes(n: u64, t: usize) -> Vec<usize> {
    let (q, r) = (n / t as u64, n % t as u64);
    (0..t as u64)
        .map(|i| (q + u64::from(i < r)) as usize)
        .collect()
}

/// Everything one run shares: the device, the timestamp machinery and the
/// buffers of the current size.
struct Bench {
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// Pass timestamps (Features::TIMESTAMP_QUERY), unless --wall.
    timestamps: bool,
    /// Timestamps between commands too: the copy is timed on the GPU, and
    /// all results are on the GPU basis.
    gpu_basis: bool,
    inside_passes: bool,
    period_ns: f64,
    queries: Option<wgpu::QuerySet>,
    resolve: Option<wgpu::Buffer>,
    readback: Option<wgpu::Buffer>,
    reps: usize,
    warmup: usize,
}

/// The buffers of one size N.
struct Buffers {
    n: u64,
    pristine: wgpu::Buffer,
    grads: wgpu::Buffer,
    copy_dst: wgpu::Buffer,
}

impl Bench {
    fn encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    fn wait(&self) -> Res<()> {
        self.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok(())
    }

    /// Puts the pristine gradients back (untimed) and waits for it.
    fn restore(&self, b: &Buffers) -> Res<()> {
        let mut enc = self.encoder("bench restore gradients");
        enc.copy_buffer_to_buffer(&b.pristine, 0, &b.grads, 0, b.n * 4);
        self.queue.submit([enc.finish()]);
        self.wait()
    }

    /// The first `count` timestamps of the query set, in nanoseconds.
    fn read_timestamps(&self, count: u32) -> Res<Vec<f64>> {
        let (Some(queries), Some(resolve), Some(readback)) =
            (&self.queries, &self.resolve, &self.readback)
        else {
            return Ok(Vec::new());
        };
        let mut enc = self.encoder("bench resolve timestamps");
        enc.resolve_query_set(queries, 0..count, resolve, 0);
        enc.copy_buffer_to_buffer(resolve, 0, readback, 0, count as u64 * 8);
        self.queue.submit([enc.finish()]);
        let bytes = read_mapped(&self.device, readback)?;
        Ok(bytes[..count as usize * 8]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as f64 * self.period_ns)
            .collect())
    }

    /// The query slot of repetition `r` (warm-ups share the first).
    fn slot(&self, r: usize, per_rep: u32) -> u32 {
        r.saturating_sub(self.warmup) as u32 * per_rep
    }

    /// Device copy of the whole buffer, timed like the clips.
    fn copy(&self, b: &Buffers) -> Res<(f64, Vec<f64>)> {
        let mut wall = Vec::with_capacity(self.reps);
        for r in 0..self.warmup + self.reps {
            let slot = self.slot(r, 2);
            let mut enc = self.encoder("bench copy");
            let t0 = Instant::now();
            if self.gpu_basis {
                enc.write_timestamp(self.queries.as_ref().unwrap(), slot);
            }
            enc.copy_buffer_to_buffer(&b.grads, 0, &b.copy_dst, 0, b.n * 4);
            if self.gpu_basis {
                enc.write_timestamp(self.queries.as_ref().unwrap(), slot + 1);
            }
            self.queue.submit([enc.finish()]);
            self.wait()?;
            if r >= self.warmup {
                wall.push(secs(t0.elapsed()));
            }
        }
        let mut gpu: Vec<f64> = if self.gpu_basis {
            let t = self.read_timestamps(2 * self.reps as u32)?;
            t.chunks_exact(2).map(|p| (p[1] - p[0]) * 1e-9).collect()
        } else {
            wall.clone()
        };
        Ok((median(&mut gpu), gpu))
    }
}

/// Per-repetition samples of one case.
struct Samples {
    wall: Vec<f64>,
    record: Vec<f64>,
    passes: BTreeMap<String, Vec<f64>>,
    gpu_total: Vec<f64>,
}

impl Samples {
    fn new(reps: usize) -> Self {
        Self {
            wall: Vec::with_capacity(reps),
            record: Vec::with_capacity(reps),
            passes: BTreeMap::new(),
            gpu_total: Vec::new(),
        }
    }

    /// Splits the timestamps of each repetition into passes: `names[k]` is
    /// the time from stamp k to stamp k + 1 (None: skipped); the GPU total
    /// is first to last.
    fn add_stamps(&mut self, stamps: &[f64], per_rep: usize, names: &[Option<&str>]) {
        for rep in stamps.chunks_exact(per_rep) {
            for (k, name) in names.iter().enumerate() {
                if let Some(name) = name {
                    self.passes
                        .entry(name.to_string())
                        .or_default()
                        .push((rep[k + 1] - rep[k]) * 1e-9);
                }
            }
            self.gpu_total.push((rep[per_rep - 1] - rep[0]) * 1e-9);
        }
    }
}

struct Case<'a> {
    n: u64,
    tensors: usize,
    norm: NormKind,
    step: Step,
    copy: &'a CopyResult,
}

impl Case<'_> {
    fn result(
        &self,
        implementation: &str,
        bench: &Bench,
        mut s: Samples,
        (total_norm, coefficient): (f32, f32),
    ) -> CaseResult {
        let gpu = bench.gpu_basis && !s.gpu_total.is_empty();
        let basis_samples = if gpu { &mut s.gpu_total } else { &mut s.wall };
        let min_seconds = min_of(basis_samples);
        let seconds = median(basis_samples);
        let floor_bytes = self.step.floor_bytes() * self.n;
        let gbps = floor_bytes as f64 / seconds * 1e-9;
        CaseResult {
            implementation: implementation.into(),
            n: self.n,
            tensors: self.tensors,
            norm: self.norm,
            step: self.step,
            floor_bytes,
            seconds,
            basis: if gpu { "gpu" } else { "wall" },
            min_seconds,
            wall_seconds: median(&mut s.wall),
            record_seconds: (!s.record.is_empty()).then(|| median(&mut s.record)),
            passes: s
                .passes
                .iter_mut()
                .map(|(k, v)| (k.clone(), median(v)))
                .collect(),
            gbps,
            copy_fraction: gbps / self.copy.gbps,
            limit: "device copy",
            total_norm,
            coefficient,
        }
    }
}

/// Checks a clip did what the case says: the expected kind of step and a
/// norm that matches the float64 reference.
fn check(what: &str, case: &Case, reference: f64, norm: f32, coef: f32, tol: f64) -> Res<()> {
    let clipped = coef < 1.0;
    let err = (norm as f64 - reference).abs() / reference;
    if clipped != (case.step == Step::Clip) || err.is_nan() || err > tol {
        return Err(format!(
            "{what} N={} tensors={} {} {}: norm {norm} (reference {reference}, relative error {err:.1e}), coefficient {coef}",
            case.n, case.tensors, case.norm, case.step.name()
        )
        .into());
    }
    Ok(())
}

fn gradclip_norm(norm: NormKind) -> gradclip::Norm {
    match norm {
        NormKind::L2 => gradclip::Norm::L2,
        NormKind::Inf => gradclip::Norm::Inf,
    }
}

/// gradclip's clip_norm: per-pass GPU time, wall time, record time.
fn run_gradclip(
    bench: &Bench,
    b: &Buffers,
    set: &gradclip::GradSet,
    case: &Case,
    max_norm: f32,
) -> Res<(Samples, (f32, f32))> {
    let clip = gradclip::ClipNorm::new(max_norm).norm(gradclip_norm(case.norm));
    let per_rep = gradclip::GradSet::CLIP_TIMESTAMPS;
    let mut s = Samples::new(bench.reps);
    for r in 0..bench.warmup + bench.reps {
        bench.restore(b)?;
        let mut enc = bench.encoder("bench gradclip step");
        let t0 = Instant::now();
        match &bench.queries {
            Some(q) if bench.timestamps => {
                set.clip_norm_timed(&mut enc, &clip, q, bench.slot(r, per_rep))?
            }
            _ => set.clip_norm(&mut enc, &clip)?,
        }
        let record = t0.elapsed();
        bench.queue.submit([enc.finish()]);
        bench.wait()?;
        let wall = t0.elapsed();
        if r >= bench.warmup {
            s.record.push(secs(record));
            s.wall.push(secs(wall));
        }
    }
    if bench.timestamps {
        let stamps = bench.read_timestamps(per_rep * bench.reps as u32)?;
        // 0 reduce begins, 1 finalize begins, 2 finalize ends, 3 scale begins, 4 scale ends.
        if bench.inside_passes {
            s.add_stamps(
                &stamps,
                5,
                &[
                    Some("reduce"),
                    Some("finalize"),
                    Some("args_copy"),
                    Some("scale"),
                ],
            );
        } else {
            let mut merged = Vec::with_capacity(stamps.len());
            for rep in stamps.chunks_exact(5) {
                merged.extend([rep[0], rep[2], rep[3], rep[4]]);
            }
            s.add_stamps(
                &merged,
                4,
                &[Some("reduce+finalize"), Some("args_copy"), Some("scale")],
            );
        }
    }
    let report = pollster::block_on(set.read_report())?;
    Ok((s, (report.total_norm, report.coefficient)))
}

/// The per-tensor baseline, timed the same way.
fn run_naive(
    bench: &Bench,
    b: &Buffers,
    naive: &naive::Naive,
    set: &naive::NaiveSet,
    case: &Case,
    max_norm: f32,
) -> Res<(Samples, (f32, f32))> {
    naive.set_max_norm(set, max_norm);
    let per_rep = naive::TIMESTAMPS;
    let mut s = Samples::new(bench.reps);
    for r in 0..bench.warmup + bench.reps {
        bench.restore(b)?;
        let mut enc = bench.encoder("bench naive step");
        let stamps = bench
            .queries
            .as_ref()
            .filter(|_| bench.timestamps)
            .map(|q| (q, bench.slot(r, per_rep)));
        let t0 = Instant::now();
        naive.record(set, &mut enc, case.norm, stamps);
        let record = t0.elapsed();
        bench.queue.submit([enc.finish()]);
        bench.wait()?;
        let wall = t0.elapsed();
        if r >= bench.warmup {
            s.record.push(secs(record));
            s.wall.push(secs(wall));
        }
    }
    if bench.timestamps {
        let stamps = bench.read_timestamps(per_rep * bench.reps as u32)?;
        s.add_stamps(
            &stamps,
            6,
            &[Some("norms"), None, Some("total"), None, Some("scale")],
        );
    }
    Ok((s, naive.read_result(set)?))
}

/// The CPU loop; wall time only.
fn run_cpu(
    bench: &Bench,
    host: &[f32],
    work: &mut [f32],
    ranges: &[std::ops::Range<usize>],
    case: &Case,
    max_norm: f32,
) -> (Samples, (f32, f32)) {
    let mut s = Samples::new(bench.reps);
    let mut last = (0.0, 0.0);
    for r in 0..bench.warmup + bench.reps {
        work.copy_from_slice(host);
        let t0 = Instant::now();
        last = std::hint::black_box(cpu::clip(
            std::hint::black_box(&mut *work),
            ranges,
            case.norm,
            max_norm,
        ));
        let wall = t0.elapsed();
        if r >= bench.warmup {
            s.wall.push(secs(wall));
        }
    }
    (s, last)
}

fn open_device(args: &Args) -> Res<(Bench, wgpu::AdapterInfo, Adapter)> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .map_err(|e| format!("no adapter: {e}"))?;
    let wanted = wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
    let features = if args.wall {
        wgpu::Features::empty()
    } else {
        adapter.features() & wanted
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("gradclip bench device"),
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    }))?;
    let info = adapter.get_info();
    if args.require_gpu
        && !matches!(
            info.device_type,
            wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::IntegratedGpu
        )
    {
        return Err(format!(
            "--require-gpu: the adapter is {} ({:?}, {:?})",
            info.name, info.backend, info.device_type
        )
        .into());
    }
    let has = |f| features.contains(f);
    let timestamps = has(wgpu::Features::TIMESTAMP_QUERY);
    let gpu_basis = timestamps && has(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS);
    let inside_passes = timestamps && has(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
    let reps = args.reps.max(1);
    let per_rep = naive::TIMESTAMPS.max(gradclip::GradSet::CLIP_TIMESTAMPS);
    let count = (reps as u32).saturating_mul(per_rep);
    if timestamps && count > MAX_QUERIES {
        return Err(
            format!("--reps {reps} needs more than {MAX_QUERIES} timestamp queries").into(),
        );
    }
    let (queries, resolve, readback) = if timestamps {
        let bytes = count as u64 * 8;
        (
            Some(device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            })),
            Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench timestamp resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })),
            Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench timestamp readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })),
        )
    } else {
        (None, None, None)
    };
    let adapter_json = Adapter {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        timestamp_query: adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY),
        timestamp_inside_encoders: adapter
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS),
        timestamp_inside_passes: adapter
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
    };
    let period_ns = queue.get_timestamp_period() as f64;
    Ok((
        Bench {
            device,
            queue,
            timestamps,
            gpu_basis,
            inside_passes,
            period_ns,
            queries,
            resolve,
            readback,
            reps,
            warmup: args.warmup,
        },
        info,
        adapter_json,
    ))
}

fn sizes(args: &Args, device: &wgpu::Device) -> Res<Vec<u64>> {
    let adapter_max = device.limits().max_buffer_size / 4;
    let mut sizes = if !args.sizes.is_empty() {
        args.sizes
            .iter()
            .map(|s| parse_count(s))
            .collect::<Res<Vec<u64>>>()?
    } else {
        let max = if args.quick {
            1_000_000
        } else if args.max_n == "max" {
            adapter_max
        } else {
            parse_count(&args.max_n)?
        };
        let mut v = Vec::new();
        let mut n = MIN_N;
        while n <= max {
            v.push(n);
            n *= 10;
        }
        if v.last() != Some(&max) {
            v.push(max);
        }
        v
    };
    for &n in &sizes {
        if n > adapter_max {
            return Err(format!(
                "N = {n} needs {} bytes; this adapter's largest buffer is {} bytes",
                n * 4,
                adapter_max * 4
            )
            .into());
        }
    }
    sizes.sort_unstable();
    sizes.dedup();
    Ok(sizes)
}

fn main() -> Res<()> {
    let mut args = Args::parse();
    if args.quick {
        args.warmup = args.warmup.min(1);
    }
    if args.reps < 20 {
        eprintln!(
            "warning: --reps {} is below the 20 repetitions results should use",
            args.reps
        );
    }
    let (bench, info, adapter) = open_device(&args)?;
    let sizes = sizes(&args, &bench.device)?;
    eprintln!(
        "adapter: {} ({:?}, {:?}, driver {} {})",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    eprintln!(
        "timing: {}; per-pass GPU timestamps: {}; sizes {:?}, tensors {:?}, norms {:?}, {} reps after {} warm-up",
        if bench.gpu_basis { "GPU timestamps" } else { "wall clock around submit + wait" },
        if bench.timestamps { "yes" } else { "no" },
        sizes,
        args.tensors,
        args.norms,
        bench.reps,
        bench.warmup
    );
    let started = Instant::now();
    let clipper = gradclip::Clipper::new(&bench.device, &bench.queue)?;
    let naive = naive::Naive::new(&bench.device, &bench.queue);
    let mut copies = Vec::new();
    let mut results = Vec::new();

    for &n in &sizes {
        let host = gradient(n as usize);
        let reference_l2 = host
            .iter()
            .map(|&g| g as f64 * g as f64)
            .sum::<f64>()
            .sqrt();
        let reference_inf = host.iter().fold(0.0f64, |m, &g| m.max(g.abs() as f64));
        let storage = wgpu::BufferUsages::STORAGE;
        let copy_usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let b = Buffers {
            n,
            pristine: bench
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("bench pristine gradients"),
                    contents: bytemuck::cast_slice(&host),
                    usage: wgpu::BufferUsages::COPY_SRC,
                }),
            grads: bench.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench gradients"),
                size: n * 4,
                usage: storage | copy_usage,
                mapped_at_creation: false,
            }),
            copy_dst: bench.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench copy destination"),
                size: n * 4,
                usage: wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        bench.restore(&b)?;

        let (copy_seconds, _) = bench.copy(&b)?;
        let mut work = if args.no_cpu {
            Vec::new()
        } else {
            vec![0.0f32; n as usize]
        };
        let (host_seconds, host_gbps) = if args.no_cpu {
            (None, None)
        } else {
            let mut t = Vec::with_capacity(bench.reps);
            for r in 0..bench.warmup + bench.reps {
                let t0 = Instant::now();
                work.copy_from_slice(std::hint::black_box(&host));
                let e = secs(t0.elapsed());
                if r >= bench.warmup {
                    t.push(e);
                }
            }
            let m = median(&mut t);
            (Some(m), Some(8.0 * n as f64 / m * 1e-9))
        };
        let copy = CopyResult {
            n,
            bytes: 8 * n,
            seconds: copy_seconds,
            gbps: 8.0 * n as f64 / copy_seconds * 1e-9,
            host_seconds,
            host_gbps,
        };
        eprintln!(
            "N = {n}: device copy {:.1} GB/s{}",
            copy.gbps,
            host_gbps.map_or(String::new(), |g| format!(", host copy {g:.1} GB/s"))
        );

        for &t in &args.tensors {
            if t == 0 || t as u64 > n {
                continue;
            }
            let tensor_sizes = even_sizes(n, t);
            let layout = gradclip::GradLayout::from_sizes(&tensor_sizes)?;
            let set = clipper.bind(&b.grads, &layout)?;
            let naive_set = (args.naive != NaiveCases::None
                && naive::Naive::fits(&bench.device, n))
            .then(|| naive.bind(&b.grads, &tensor_sizes));
            let ranges: Vec<_> = (0..t)
                .map(|i| {
                    let r = layout.range(i);
                    r.start as usize..r.end as usize
                })
                .collect();
            for &norm in &args.norms {
                let (reference, tol) = match norm {
                    NormKind::L2 => (reference_l2, 1e-4),
                    NormKind::Inf => (reference_inf, 0.0),
                };
                for step in [Step::Clip, Step::Noclip] {
                    let max_norm = match step {
                        Step::Clip => 0.5 * reference,
                        Step::Noclip => 2.0 * reference,
                    } as f32;
                    let case = Case {
                        n,
                        tensors: t,
                        norm,
                        step,
                        copy: &copy,
                    };
                    let (s, out) = run_gradclip(&bench, &b, &set, &case, max_norm)?;
                    check("gradclip", &case, reference, out.0, out.1, tol)?;
                    results.push(case.result("gradclip", &bench, s, out));
                    if let Some(ns) = naive_set.as_ref().filter(|_| args.naive.runs(norm, step)) {
                        let (s, out) = run_naive(&bench, &b, &naive, ns, &case, max_norm)?;
                        check("naive", &case, reference, out.0, out.1, tol.max(1e-3))?;
                        results.push(case.result("naive", &bench, s, out));
                    }
                    if !args.no_cpu {
                        let (s, out) = run_cpu(&bench, &host, &mut work, &ranges, &case, max_norm);
                        check("cpu", &case, reference, out.0, out.1, tol.max(1e-3))?;
                        let mut r = case.result("cpu", &bench, s, out);
                        r.basis = "wall";
                        r.copy_fraction = r.gbps / host_gbps.unwrap_or(f64::NAN);
                        r.limit = "host copy";
                        results.push(r);
                    }
                    eprint!(".");
                }
            }
        }
        eprintln!();
        copies.push(copy);
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());

    let run = Run {
        schema: "gradclip-bench/1",
        tool: "gradclip",
        date_utc: date_utc(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        adapter,
        basis: if bench.gpu_basis { "gpu" } else { "wall" },
        reps: bench.reps,
        warmup: bench.warmup,
        copy: copies,
        results,
    };
    print!("{}", markdown(&run));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&run)?)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        plot::svg(&run.copy, &run.results, &plot_title(&run), path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn plot_title(run: &Run) -> String {
    format!(
        "gradclip clip_norm, {} ({}), {}",
        run.adapter.name, run.adapter.backend, run.date_utc
    )
}

fn us(s: f64) -> String {
    let v = s * 1e6;
    if !v.is_finite() {
        "–".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Three significant digits, no exponent.
fn sig(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let digits = (2 - v.abs().max(1e-9).log10().floor() as i32).clamp(0, 9) as usize;
    format!("{v:.digits$}")
}

fn pass(r: &CaseResult, name: &str) -> String {
    r.passes.get(name).map_or("–".into(), |&s| us(s))
}

/// The results as markdown tables.
fn markdown(run: &Run) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let a = &run.adapter;
    let _ = writeln!(
        o,
        "## gradclip benchmark: {} ({}, {}, driver {} {})\n",
        a.name, a.backend, a.device_type, a.driver, a.driver_info
    );
    let _ = writeln!(
        o,
        "{}; `{}`. Median of {} repetitions after {} warm-up; times in µs on the {} basis ({}).\n",
        run.date_utc,
        run.command,
        run.reps,
        run.warmup,
        run.basis,
        if run.basis == "gpu" {
            "GPU timestamps from the first pass's start to the last pass's end"
        } else {
            "wall clock around submit + wait"
        }
    );
    let _ = writeln!(o, "### Copy bandwidth (the limit)\n");
    let _ = writeln!(
        o,
        "| N | bytes moved | device copy µs | device GB/s | host copy GB/s |"
    );
    let _ = writeln!(o, "|---:|---:|---:|---:|---:|");
    for c in &run.copy {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.1} | {} |",
            c.n,
            c.bytes,
            us(c.seconds),
            c.gbps,
            c.host_gbps.map_or("–".into(), |g| format!("{g:.1}"))
        );
    }
    let _ = writeln!(
        o,
        "\n### Clip steps and no-clip steps\n\nGB/s = floor bytes (12 N for a clip, 4 N for no clip) / time; % copy = that / the copy bandwidth of the same N (host copy for the CPU rows). Passes: gradclip reduce / finalize / indirect-args copy / scale, naive norms / total / scale. e2e = record + submit + wait on the host.\n"
    );
    let _ = writeln!(
        o,
        "| N | tensors | norm | step | impl | time µs | GB/s | % copy | passes µs | e2e µs | record µs |"
    );
    let _ = writeln!(o, "|---:|---:|---|---|---|---:|---:|---:|---|---:|---:|");
    for r in &run.results {
        let passes = match r.implementation.as_str() {
            "gradclip" if r.passes.contains_key("reduce") => format!(
                "{} / {} / {} / {}",
                pass(r, "reduce"),
                pass(r, "finalize"),
                pass(r, "args_copy"),
                pass(r, "scale")
            ),
            "gradclip" if !r.passes.is_empty() => format!(
                "{} (reduce+finalize) / {} / {}",
                pass(r, "reduce+finalize"),
                pass(r, "args_copy"),
                pass(r, "scale")
            ),
            "naive" if !r.passes.is_empty() => format!(
                "{} / {} / {}",
                pass(r, "norms"),
                pass(r, "total"),
                pass(r, "scale")
            ),
            _ => "–".into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {}% | {} | {} | {} |",
            r.n,
            r.tensors,
            r.norm,
            r.step.name(),
            r.implementation,
            us(r.seconds),
            sig(r.gbps),
            sig(100.0 * r.copy_fraction),
            passes,
            us(r.wall_seconds),
            r.record_seconds.map_or("–".into(), us)
        );
    }
    // Ratios between implementations of the same case, from this run.
    let find = |imp: &str, g: &CaseResult| {
        run.results.iter().find(|r| {
            r.implementation == imp
                && r.n == g.n
                && r.tensors == g.tensors
                && r.norm == g.norm
                && r.step == g.step
        })
    };
    let _ = writeln!(
        o,
        "\n### Ratios (same run)\n\nTime of each baseline / gradclip's time (above 1: gradclip is faster); record time likewise.\n"
    );
    let _ = writeln!(
        o,
        "| N | tensors | norm | step | gradclip % copy | naive / gradclip | naive record / gradclip record | cpu / gradclip (wall) |"
    );
    let _ = writeln!(o, "|---:|---:|---|---|---:|---:|---:|---:|");
    for g in run
        .results
        .iter()
        .filter(|r| r.implementation == "gradclip")
    {
        let naive = find("naive", g);
        let cpu = find("cpu", g);
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {}% | {} | {} | {} |",
            g.n,
            g.tensors,
            g.norm,
            g.step.name(),
            sig(100.0 * g.copy_fraction),
            naive.map_or("–".into(), |r| sig(r.seconds / g.seconds)),
            naive
                .and_then(|r| Some(r.record_seconds? / g.record_seconds?))
                .map_or("–".into(), sig),
            cpu.map_or("–".into(), |r| sig(r.wall_seconds / g.wall_seconds)),
        );
    }
    o
}
