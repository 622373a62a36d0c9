//! gradclip benchmark: times `GradSet::clip_norm` against the adapter's own
//! copy bandwidth, a per-tensor baseline and a CPU loop, in one run.
//!
//! `cargo run --release --example bench -- --help`; docs/benchmark.md has the
//! commands, the JSON schema and the figures measured so far.

mod cpu;
mod measure;
mod naive;
mod plot;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

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

use measure::{Bench, Buffers, CaseInputs, CpuCase, Samples};

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

/// The copy bandwidth of one size: each case measures its own next to its
/// clips; this is the median over the cases of that size.
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
    /// gbps / limit_gbps.
    pub copy_fraction: f64,
    /// "device copy" for GPU rows, "host copy" for the CPU baseline.
    pub limit: &'static str,
    /// The copy bandwidth of the same N, measured in this case's repetitions
    /// (interleaved with the clips), bytes read plus bytes written.
    pub limit_gbps: f64,
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

/// One case's identity.
struct Case {
    n: u64,
    tensors: usize,
    norm: NormKind,
    step: Step,
}

impl Case {
    /// The result row of one implementation: medians on the run's basis
    /// (GPU time where there are timestamps, wall time otherwise).
    fn result(
        &self,
        implementation: &str,
        gpu_basis: bool,
        (mut s, (total_norm, coefficient)): (Samples, (f32, f32)),
        (limit, limit_gbps): (&'static str, f64),
    ) -> CaseResult {
        let gpu = gpu_basis && !s.gpu_total.is_empty();
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
            copy_fraction: gbps / limit_gbps,
            limit,
            limit_gbps,
            total_norm,
            coefficient,
        }
    }

    /// Checks that a clip did what the case says: the intended kind of step
    /// and a norm that matches the float64 reference. A broken path must
    /// never report a fast time.
    fn check(&self, what: &str, reference: f64, (norm, coef): (f32, f32), tol: f64) -> Res<()> {
        let clipped = coef < 1.0;
        let err = (norm as f64 - reference).abs() / reference;
        if clipped != (self.step == Step::Clip) || err.is_nan() || err > tol {
            return Err(format!(
                "{what} N={} tensors={} {} {}: norm {norm} (reference {reference}, relative error {err:.1e}), coefficient {coef}",
                self.n, self.tensors, self.norm, self.step.name()
            )
            .into());
        }
        Ok(())
    }
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
    let count = (reps as u32).saturating_mul(measure::STAMPS_PER_REP);
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
        let mut work = if args.no_cpu {
            Vec::new()
        } else {
            vec![0.0f32; n as usize]
        };
        let (mut copy_medians, mut host_medians) = (Vec::new(), Vec::new());

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
                    };
                    let mut m = bench.run_case(CaseInputs {
                        buffers: &b,
                        set: &set,
                        naive: naive_set
                            .as_ref()
                            .filter(|_| args.naive.runs(norm, step))
                            .map(|s| (&naive, s)),
                        cpu: (!args.no_cpu).then(|| CpuCase {
                            host: &host,
                            work: &mut work,
                            ranges: &ranges,
                        }),
                        norm,
                        max_norm,
                    })?;
                    let copy_seconds = median(&mut m.copy);
                    copy_medians.push(copy_seconds);
                    let device_copy = ("device copy", 8.0 * n as f64 / copy_seconds * 1e-9);
                    case.check("gradclip", reference, m.gradclip.1, tol)?;
                    results.push(case.result("gradclip", bench.gpu_basis, m.gradclip, device_copy));
                    if let Some(out) = m.naive {
                        case.check("naive", reference, out.1, tol.max(1e-3))?;
                        results.push(case.result("naive", bench.gpu_basis, out, device_copy));
                    }
                    if let Some(out) = m.cpu {
                        let host_seconds = median(&mut m.host_copy);
                        host_medians.push(host_seconds);
                        let host_copy = ("host copy", 8.0 * n as f64 / host_seconds * 1e-9);
                        case.check("cpu", reference, out.1, tol.max(1e-3))?;
                        results.push(case.result("cpu", false, out, host_copy));
                    }
                    eprint!(".");
                }
            }
        }
        let seconds = median(&mut copy_medians);
        let host_seconds = (!host_medians.is_empty()).then(|| median(&mut host_medians));
        let copy = CopyResult {
            n,
            bytes: 8 * n,
            seconds,
            gbps: 8.0 * n as f64 / seconds * 1e-9,
            host_seconds,
            host_gbps: host_seconds.map(|s| 8.0 * n as f64 / s * 1e-9),
        };
        eprintln!(
            " N = {n}: device copy {:.1} GB/s{}",
            copy.gbps,
            copy.host_gbps
                .map_or(String::new(), |g| format!(", host copy {g:.1} GB/s"))
        );
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
    print!("{}", report::markdown(&run));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&run)?)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        plot::svg(&run.copy, &run.results, &report::plot_title(&run), path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
