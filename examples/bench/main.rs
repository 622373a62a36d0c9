//! gradclip benchmark: times `GradSet::clip_norm` against the adapter's own
//! copy bandwidth, roofline kernels (a read-only sum and an in-place
//! multiply; the sum of powers for a general p and the read writing one
//! record per tensor for tensor norms), a per-tensor baseline and a CPU
//! loop, in one run.
//!
//! `cargo run --release --example bench -- --help`; docs/benchmark.md has the
//! commands, the JSON schema and the figures measured so far.

mod chunks;
mod cpu;
mod measure;
mod models;
mod naive;
mod plot;
mod report;
mod roofline;
mod sweep;
mod targets;

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
/// The JSON schema this bench writes.
const SCHEMA: &str = "gradclip-bench/2";
/// The tensor counts and norms of a run that names none.
const DEFAULT_TENSORS: [usize; 3] = [1, 100, 10_000];
const DEFAULT_NORMS: [NormKind; 2] = [NormKind::L2, NormKind::Inf];
/// `--targets`: the cases of the performance targets (issue 10).
const TARGET_SIZES: [u64; 2] = [10_000_000, 25_000_000];
const TARGET_TENSORS: [usize; 2] = [1, 10_000];
const TARGET_NORMS: [NormKind; 4] = [NormKind::L2, NormKind::Inf, NormKind::P3, NormKind::P1_5];
const TARGET_ONE_ELEMENT: usize = 200_000;

use measure::{Bench, Buffers, CaseInputs, CpuCase, RooflineCase, Samples};
use roofline::{Kind, Load, Rooflines, Shape, Walk};

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
    /// Tensor counts; the N elements are split evenly among them
    /// [default: 1,100,10000].
    #[arg(long, value_delimiter = ',')]
    tensors: Vec<usize>,
    /// Norms to time [default: l2,inf].
    #[arg(long, value_delimiter = ',')]
    norms: Vec<NormKind>,
    /// Also time every case with `ClipNorm::tensor_norms(true)` in the same
    /// repetitions (implementation "gradclip-tensor-norms").
    #[arg(long)]
    tensor_norms: bool,
    /// Also time every case's plain `clip_norm` between two timestamps
    /// written around it (implementation "gradclip-whole"): the step as
    /// users record it, without the timestamps that the "gradclip" row
    /// writes between its passes. Needs TIMESTAMP_QUERY_INSIDE_ENCODERS.
    #[arg(long)]
    whole_step: bool,
    /// Add cases of this many one-element tensors (N = the count), e.g. 200000.
    #[arg(long)]
    one_element: Option<usize>,
    /// Add cases with a real model's parameter layout (N = its parameter
    /// count, tensors = its tensor count): short tensors between long ones,
    /// as no even split has them.
    #[arg(long, value_delimiter = ',', value_enum)]
    model: Vec<models::Model>,
    /// Tensors of different scales, as real models' layers are: each
    /// tensor's values multiplied by 10^-u, u drawn per tensor (the same
    /// in every run) from [0, DECADES). 0: every tensor as generated.
    #[arg(long, default_value_t = 0.0, value_name = "DECADES")]
    spread: f64,
    /// The cases of the performance targets: sizes 1e7,2.5e7, tensors
    /// 1,10000, norms l2,inf,p3,p1.5, --tensor-norms, --one-element 200000
    /// (each unless given explicitly).
    #[arg(long)]
    targets: bool,
    /// Skip the roofline kernels.
    #[arg(long)]
    no_roofline: bool,
    /// Roofline shapes to try, crossed: load widths...
    #[arg(long, value_delimiter = ',', value_enum)]
    roof_loads: Vec<Load>,
    /// ...accumulators (loads in flight) per invocation (1, 2, 4, 8)...
    #[arg(long, value_delimiter = ',')]
    roof_acc: Vec<u32>,
    /// ...workgroup sizes (powers of two)...
    #[arg(long, value_delimiter = ',')]
    roof_wg: Vec<u32>,
    /// ...workgroup counts (1 to 4096)...
    #[arg(long, value_delimiter = ',')]
    roof_groups: Vec<u32>,
    /// ...and walks. Unset dimensions take the tuning defaults (vec4;
    /// 2,4,8; 16,64,256; 4,64,256,1024; grid,blocked,invocation), or with
    /// --sweep the full grid (vec4,scalar4,scalar1; 1,2,4,8; 64,128,256;
    /// 16,64,256,1024,4096; grid,blocked,invocation). The fastest read,
    /// multiply (and power) shape of each N, and with --tensor-norms the
    /// fastest records shape of each tensor count (fastest of --tune-reps
    /// repetitions), are then timed in every case's repetitions.
    #[arg(long, value_delimiter = ',', value_enum)]
    roof_walks: Vec<Walk>,
    /// Repetitions of each candidate shape when choosing the rooflines.
    #[arg(long, default_value_t = 5)]
    tune_reps: usize,
    /// Instead of the clip cases: time every roofline shape, what naga's
    /// runtime checks cost the fastest, and the per-chunk reduction
    /// (tree vs subgroup) for --chunk-ks; tables on stdout, --json.
    #[arg(long)]
    sweep: bool,
    /// Chunk lengths of the sweep's per-chunk reduction experiment.
    #[arg(long, value_delimiter = ',', default_values_t = [1024u32, 2048, 4096, 8192, 16384, 32768, 65536])]
    chunk_ks: Vec<u32>,
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
    /// Write the results as JSON (schema "gradclip-bench/2"; with --sweep
    /// "gradclip-bench-sweep/1").
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
        // The baseline has L2 and Inf kernels only.
        norm.p().is_none()
            && match self {
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
    /// The p = 3 norm, standing for gradclip's integer-p path (p = 1 to 8).
    P3,
    /// The p = 1.5 norm, standing for gradclip's path for any other p.
    #[value(name = "p1.5")]
    #[serde(rename = "p1.5")]
    P1_5,
    /// The p = 4.5 norm: the same path at a large p, whose walk leaves
    /// tensors more than 2^(32/4.5), about 140, times below the largest
    /// before them in a chunk to the per-segment paths (see --spread).
    #[value(name = "p4.5")]
    #[serde(rename = "p4.5")]
    P4_5,
}

impl NormKind {
    /// The p of a general-p norm.
    pub fn p(self) -> Option<f64> {
        match self {
            NormKind::L2 | NormKind::Inf => None,
            NormKind::P3 => Some(3.0),
            NormKind::P1_5 => Some(1.5),
            NormKind::P4_5 => Some(4.5),
        }
    }

    /// The p of a norm whose terms need a pow (not an integer p), which the
    /// power roofline is timed with.
    pub fn general_p(self) -> Option<f64> {
        self.p().filter(|p| p.fract() != 0.0)
    }
}

impl std::fmt::Display for NormKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NormKind::L2 => "l2",
            NormKind::Inf => "inf",
            NormKind::P3 => "p3",
            NormKind::P1_5 => "p1.5",
            NormKind::P4_5 => "p4.5",
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
    /// The max_norm that makes a data set of this norm clip or not.
    fn max_norm(self, norm: f64) -> f32 {
        let factor = match self {
            Step::Clip => 0.5,
            Step::Noclip => 2.0,
        };
        (factor * norm) as f32
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
    /// The roofline kernels of each N: the shapes kept and what they reached.
    rooflines: Vec<RooflineResult>,
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
    /// Features::SUBGROUP, and the subgroup sizes wgpu reports.
    subgroup: bool,
    subgroup_min_size: u32,
    subgroup_max_size: u32,
}

/// One roofline kernel at one N: the shape kept and its time, the median
/// over that N's cases (each times it in its own repetitions).
#[derive(Serialize, Clone)]
pub struct RooflineKernel {
    pub shape: Shape,
    pub label: String,
    /// Bytes read (read, power) or read + written (multiply, records): 16
    /// or 32 per vec4, over the first 4 (N / 4) elements, plus 16 per
    /// record for the records kernel.
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
}

/// A candidate shape tried when choosing the rooflines of one N.
#[derive(Serialize, Clone)]
pub struct Tried {
    pub kind: Kind,
    pub shape: Shape,
    pub label: String,
    /// Median of --tune-reps runs, on the run's basis.
    pub seconds: f64,
    pub gbps: f64,
    /// The fastest of them, which decides: on a shared machine load only
    /// adds time, so the fastest run is the closest to the kernel's own.
    pub min_seconds: f64,
    pub min_gbps: f64,
}

#[derive(Serialize, Clone)]
pub struct RooflineResult {
    pub n: u64,
    pub read: RooflineKernel,
    pub multiply: RooflineKernel,
    /// The power kernel (|x|^p summed), where a case has a general p.
    pub power: Option<RooflineKernel>,
    /// The records kernel of each tensor count timed with tensor norms
    /// (--tensor-norms; else empty).
    pub records: Vec<RecordsRoofline>,
    /// Every candidate, fastest first per kind (the records kernel's are
    /// in `records`).
    pub tried: Vec<Tried>,
}

/// The records kernel (the read writing one 16-byte record per tensor) of
/// one (N, tensor count): tuned for that record count, its time the median
/// over the case's norms and steps.
#[derive(Serialize, Clone)]
pub struct RecordsRoofline {
    /// Tensors of the case, i.e. records written.
    pub tensors: usize,
    #[serde(flatten)]
    pub kernel: RooflineKernel,
    /// Every candidate shape at this record count, fastest first.
    pub tried: Vec<Tried>,
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
    /// "gradclip", "gradclip-tensor-norms" (the same clip with
    /// `tensor_norms(true)`), "gradclip-whole" (the plain clip timed
    /// without timestamps between its passes), "naive" (a dispatch per tensor), "cpu" (Rust
    /// loop), "torch".
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
    /// The read and multiply rooflines of the same N, measured in this
    /// case's repetitions (GPU rows only).
    pub read_roofline_gbps: Option<f64>,
    pub multiply_roofline_gbps: Option<f64>,
    /// The time the rooflines need for this step's floor bytes (4 N read,
    /// plus 8 N multiplied for a clip step) / this step's time.
    pub roofline_fraction: Option<f64>,
    /// The same per pass: reduce (or reduce+finalize, naive norms) against
    /// 4 N bytes at the read roofline; scale against 8 N at the multiply
    /// roofline (clip steps).
    pub pass_roofline_fractions: BTreeMap<String, f64>,
    /// The same from each pass's fastest repetition and each roofline's
    /// fastest. A ratio of medians is only as steady as both medians: on
    /// SwiftShader (2 cores) the repetitions of a read-only pass spread up
    /// to 2x its fastest, each pass on its own (10^7 elements: the read
    /// roofline's median at 1.12-1.41x its fastest), so a median over a
    /// median swings with the draw; the fastest repetitions compare the
    /// kernels each at its best. Where a pass takes under a millisecond,
    /// one lucky repetition of a roofline sways this one instead.
    pub pass_roofline_fractions_fastest: BTreeMap<String, f64>,
    /// The same paired by repetition: the median, over the repetitions, of
    /// the roofline's time in a repetition (for this case's bytes) / the
    /// pass's time in the same repetition. A repetition runs the clips and
    /// the rooflines back to back, so a host that slows down for seconds
    /// slows both sides of each ratio alike: on the fortieth and
    /// forty-first sessions' host, where a case's medians moved up to 1.7x
    /// from run to run, these spread least over repeated runs
    /// (docs/bench-cpu-drivers.md, forty-first session).
    pub pass_roofline_fractions_paired: BTreeMap<String, f64>,
    /// General p only: the power roofline (|x|^p summed, vec4 loads), measured
    /// in this case's repetitions.
    pub power_roofline_gbps: Option<f64>,
    /// General p only: the time the power roofline needs for 4 N bytes / the
    /// reduce pass's (or reduce+finalize's) time.
    pub reduce_power_fraction: Option<f64>,
    /// gradclip-tensor-norms only: the records roofline (the read writing
    /// one 16-byte record per tensor, tuned for this tensor count), measured
    /// in this case's repetitions: (16 (N / 4) + 16 tensors) bytes / its
    /// median time, that time, and its shape.
    pub records_roofline_gbps: Option<f64>,
    pub records_roofline_seconds: Option<f64>,
    pub records_roofline_shape: Option<Shape>,
    /// gradclip-tensor-norms only: the records roofline's time / the read
    /// roofline's, in the same repetitions.
    pub records_over_read: Option<f64>,
    /// gradclip-tensor-norms only: the records roofline's time / this
    /// step's reduce pass's (or reduce+finalize's) time.
    pub reduce_records_fraction: Option<f64>,
    /// gradclip-tensor-norms only: the median, over the repetitions, of
    /// this step's time / the plain step's time in the same repetition
    /// (tensor norms / plain, paired as `pass_roofline_fractions_paired`).
    pub over_plain_paired: Option<f64>,
    /// gradclip rows of a p norm only: the median, over the repetitions, of
    /// this step's time / the time of a plain L2 step of the same kind
    /// (clip or no-clip) timed in the same repetition (/ L2, paired).
    pub over_l2_paired: Option<f64>,
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

/// Whether a row's times are GPU time: on a GPU-basis run, where it has
/// GPU samples (the CPU row has none).
fn on_gpu(s: &Samples, gpu_basis: bool) -> bool {
    gpu_basis && !s.gpu_total.is_empty()
}

/// A row's samples on its basis (on_gpu): GPU time, else wall time.
fn basis(s: &Samples, gpu_basis: bool) -> &[f64] {
    if on_gpu(s, gpu_basis) {
        &s.gpu_total
    } else {
        &s.wall
    }
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

/// The median over repetitions of a[i] / b[i], both timed in repetition i;
/// None unless both have the same, non-zero, number of repetitions.
fn paired_ratio(a: &[f64], b: &[f64]) -> Option<f64> {
    (a.len() == b.len() && !a.is_empty()).then(|| {
        let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        median(&mut r)
    })
}

/// Per-repetition times of one case, for ratios paired by repetition: the
/// read and multiply rooflines' (scaled to the case's 4 N and 8 N bytes),
/// and the plain step's on the run's basis.
struct PairedReps<'a> {
    roof: Option<(&'a [f64], &'a [f64])>,
    plain: &'a [f64],
    /// The plain L2 step's beside a p case's (CaseInputs::l2_beside).
    l2: Option<&'a [f64]>,
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
        .map(|_| ((xorshift(&mut x) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02)
        .collect()
}

/// The next state of the bench's xorshift64 sequences (their values).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// `host` with tensor `ranges[i]` multiplied by 10^-u_i, u_i in
/// [0, decades) from a fixed sequence (`--spread`).
fn spread(host: &[f32], ranges: &[std::ops::Range<usize>], decades: f64) -> Vec<f32> {
    let mut out = host.to_vec();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for r in ranges {
        let u = (xorshift(&mut x) >> 11) as f64 / (1u64 << 53) as f64 * decades;
        let k = 10f64.powf(-u);
        for v in &mut out[r.clone()] {
            *v = (f64::from(*v) * k) as f32;
        }
    }
    out
}

/// Adds the case of `t` tensors at N = `n` to the (N, tensor counts)
/// groups, once.
fn add_case(groups: &mut Vec<(u64, Vec<usize>)>, n: u64, t: usize) {
    match groups.iter_mut().find(|g| g.0 == n) {
        Some(g) if !g.1.contains(&t) => g.1.push(t),
        Some(_) => {}
        None => groups.push((n, vec![t])),
    }
}

/// N split evenly into `t` tensors.
fn even_sizes(n: u64, t: usize) -> Vec<usize> {
    let (q, r) = (n / t as u64, n % t as u64);
    (0..t as u64)
        .map(|i| (q + u64::from(i < r)) as usize)
        .collect()
}

/// The roofline rates measured in one case's repetitions.
#[derive(Clone, Copy)]
struct RoofRates {
    read_gbps: f64,
    /// The read roofline's median time.
    read_seconds: f64,
    /// The read and multiply rooflines' fastest repetitions.
    read_fastest: f64,
    multiply_fastest: f64,
    multiply_gbps: f64,
    /// The power roofline's, in a general p's cases.
    power_gbps: Option<f64>,
    /// The records roofline's, in the gradclip-tensor-norms row only.
    records: Option<RecordsRate>,
}

/// The records roofline measured in one case's repetitions.
#[derive(Clone, Copy)]
struct RecordsRate {
    seconds: f64,
    gbps: f64,
    shape: Shape,
}

/// One case's identity.
struct Case {
    n: u64,
    tensors: usize,
    norm: NormKind,
    step: Step,
}

impl Case {
    /// What pass `name` is judged against: the read roofline's `read` for
    /// the reduce (reduce+finalize, naive norms), the multiply roofline's
    /// `multiply` for a clip's scale pass; None for the others.
    fn pass_roofline<T>(&self, name: &str, read: T, multiply: T) -> Option<T> {
        match name {
            "reduce" | "reduce+finalize" | "norms" => Some(read),
            "scale" if self.step == Step::Clip => Some(multiply),
            _ => None,
        }
    }

    /// The result row of one implementation: medians on the run's basis
    /// (GPU time where there are timestamps, wall time otherwise).
    fn result(
        &self,
        implementation: &str,
        gpu_basis: bool,
        (mut s, (total_norm, coefficient)): (Samples, (f32, f32)),
        (limit, limit_gbps): (&'static str, f64),
        roofline: Option<RoofRates>,
        paired: Option<&PairedReps>,
    ) -> CaseResult {
        let gpu = on_gpu(&s, gpu_basis);
        // Before the medians below sort the samples out of repetition order.
        let mut pass_roofline_fractions_paired = BTreeMap::new();
        if let Some((read, multiply)) = paired.and_then(|p| p.roof) {
            for (name, v) in &s.passes {
                let Some(limit) = self.pass_roofline(name, read, multiply) else {
                    continue;
                };
                if let Some(f) = paired_ratio(limit, v) {
                    pass_roofline_fractions_paired.insert(name.clone(), f);
                }
            }
        }
        let over_plain_paired = paired
            .filter(|_| implementation == "gradclip-tensor-norms")
            .and_then(|p| paired_ratio(basis(&s, gpu), p.plain));
        let over_l2_paired = paired
            .filter(|_| implementation == "gradclip")
            .and_then(|p| paired_ratio(basis(&s, gpu), p.l2?));
        let basis_samples = if gpu { &mut s.gpu_total } else { &mut s.wall };
        let min_seconds = min_of(basis_samples);
        let seconds = median(basis_samples);
        let floor_bytes = self.step.floor_bytes() * self.n;
        let gbps = floor_bytes as f64 / seconds * 1e-9;
        let passes: BTreeMap<String, f64> = s
            .passes
            .iter_mut()
            .map(|(k, v)| (k.clone(), median(v)))
            .collect();
        // Seconds the rooflines need for this case's bytes.
        let n = self.n as f64;
        let read_time = roofline.map(|r| 4.0 * n / (r.read_gbps * 1e9));
        let multiply_time = roofline.map(|r| 8.0 * n / (r.multiply_gbps * 1e9));
        let power_time = roofline
            .and_then(|r| r.power_gbps)
            .map(|g| 4.0 * n / (g * 1e9));
        let reduce_time = report::REDUCE_PASSES
            .iter()
            .find_map(|k| passes.get(*k).copied());
        let reduce_power_fraction = power_time.and_then(|limit| Some(limit / reduce_time?));
        let records = roofline.and_then(|r| r.records);
        let reduce_records_fraction = records.and_then(|r| Some(r.seconds / reduce_time?));
        let mut pass_roofline_fractions = BTreeMap::new();
        let mut pass_roofline_fractions_fastest = BTreeMap::new();
        if let (Some(read), Some(multiply), Some(r)) = (read_time, multiply_time, roofline) {
            for (name, &t) in &passes {
                let Some((limit, fastest)) = self.pass_roofline(
                    name,
                    (read, r.read_fastest),
                    (multiply, r.multiply_fastest),
                ) else {
                    continue;
                };
                pass_roofline_fractions.insert(name.clone(), limit / t);
                pass_roofline_fractions_fastest
                    .insert(name.clone(), fastest / min_of(&s.passes[name]));
            }
        }
        let roofline_fraction = match (read_time, multiply_time, self.step) {
            (Some(r), Some(m), Step::Clip) => Some((r + m) / seconds),
            (Some(r), _, Step::Noclip) => Some(r / seconds),
            _ => None,
        };
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
            passes,
            gbps,
            copy_fraction: gbps / limit_gbps,
            limit,
            limit_gbps,
            read_roofline_gbps: roofline.map(|r| r.read_gbps),
            multiply_roofline_gbps: roofline.map(|r| r.multiply_gbps),
            roofline_fraction,
            pass_roofline_fractions,
            pass_roofline_fractions_fastest,
            pass_roofline_fractions_paired,
            power_roofline_gbps: roofline.and_then(|r| r.power_gbps),
            reduce_power_fraction,
            records_roofline_gbps: records.map(|r| r.gbps),
            records_roofline_seconds: records.map(|r| r.seconds),
            records_roofline_shape: records.map(|r| r.shape),
            records_over_read: roofline.and_then(|rf| Some(rf.records?.seconds / rf.read_seconds)),
            reduce_records_fraction,
            over_plain_paired,
            over_l2_paired,
            total_norm,
            coefficient,
        }
    }

    /// Checks the per-tensor norms of a `tensor_norms(true)` report against
    /// the float64 reference of each tensor.
    fn check_tensor_norms(&self, got: &[f32], want: &[f64], tol: f64) -> Res<()> {
        if got.len() != want.len() {
            return Err(format!(
                "gradclip-tensor-norms N={} tensors={} {}: {} tensor norms reported",
                self.n,
                self.tensors,
                self.norm,
                got.len()
            )
            .into());
        }
        for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = if w == 0.0 {
                g.abs() as f64
            } else {
                (g as f64 - w).abs() / w
            };
            if err.is_nan() || err > tol {
                return Err(format!(
                    "gradclip-tensor-norms N={} tensors={} {}: tensor {k} norm {g} (reference {w})",
                    self.n, self.tensors, self.norm
                )
                .into());
            }
        }
        Ok(())
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
    let timing_features = if args.wall {
        wgpu::Features::empty()
    } else {
        adapter.features() & wanted
    };
    // Subgroups where the adapter has them: gradclip may take a subgroup
    // fast path (never required), and the sweep compares it with trees.
    let features = timing_features | (adapter.features() & wgpu::Features::SUBGROUP);
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
        subgroup: adapter.features().contains(wgpu::Features::SUBGROUP),
        subgroup_min_size: info.subgroup_min_size,
        subgroup_max_size: info.subgroup_max_size,
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

/// Tensors above which the per-tensor baseline is left out: it records two
/// dispatches per tensor, about a second per repetition at 10 000 tensors
/// on lavapipe.
const NAIVE_MAX_TENSORS: usize = 10_000;

/// The candidate roofline shapes of each kind: the cross product of the
/// --roof-* lists, each dimension defaulting to `wide` (--sweep) or the
/// tuning set, less the shapes the device cannot run.
fn candidates(args: &Args, rooflines: &Rooflines, wide: bool) -> Res<Vec<Shape>> {
    let or = |v: &Vec<u32>, narrow: &[u32], full: &[u32]| -> Vec<u32> {
        if !v.is_empty() {
            v.clone()
        } else if wide {
            full.to_vec()
        } else {
            narrow.to_vec()
        }
    };
    let loads = if !args.roof_loads.is_empty() {
        args.roof_loads.clone()
    } else if wide {
        vec![Load::Vec4, Load::Scalar4, Load::Scalar1]
    } else {
        vec![Load::Vec4]
    };
    let accs = or(&args.roof_acc, &[2, 4, 8], &[1, 2, 4, 8]);
    // Small and few workgroups for the CPU adapters: at 2e5 elements the
    // read and records kernels took 1.5-10x less time with 16 to 256
    // invocations in all than with the fastest of 64 x 64 and more
    // (SwiftShader, whose read paid about 1.5 ms a dispatch at 64 x 64
    // for the workgroup sum's barriers, as much with one barrier as with
    // all seven, most), and GPUs tune past these anyway.
    let wgs = or(&args.roof_wg, &[16, 64, 256], &[64, 128, 256]);
    let groups = or(
        &args.roof_groups,
        &[4, 64, 256, 1024],
        &[16, 64, 256, 1024, 4096],
    );
    let walks = if args.roof_walks.is_empty() {
        vec![Walk::Grid, Walk::Blocked, Walk::Invocation]
    } else {
        args.roof_walks.clone()
    };
    let mut shapes = Vec::new();
    for &load in &loads {
        for &acc in &accs {
            for &workgroup_size in &wgs {
                for &workgroups in &groups {
                    for &walk in &walks {
                        let shape = Shape {
                            load,
                            acc,
                            workgroup_size,
                            workgroups,
                            walk,
                        };
                        if rooflines.supports(&shape) {
                            shapes.push(shape);
                        } else {
                            eprintln!("roofline shape {} cannot run here: left out", shape.label());
                        }
                    }
                }
            }
        }
    }
    if shapes.is_empty() {
        return Err("no roofline shape this device can run".into());
    }
    Ok(shapes)
}

/// Fills `b.grads` with ones, runs `f`, and restores the gradients.
fn with_ones<T>(bench: &Bench, b: &Buffers, f: impl FnOnce() -> Res<T>) -> Res<T> {
    let ones = bench
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("bench ones"),
            contents: bytemuck::cast_slice(&vec![1.0f32; b.n as usize]),
            usage: wgpu::BufferUsages::COPY_SRC,
        });
    let mut enc = bench
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("bench fill ones"),
        });
    enc.copy_buffer_to_buffer(&ones, 0, &b.grads, 0, b.n * 4);
    bench.queue.submit([enc.finish()]);
    let out = f();
    bench.restore(b)?;
    out
}

/// Times every candidate shape of `kind` round-robin; returns them fastest
/// first (by their fastest repetition).
fn tune(
    bench: &Bench,
    rooflines: &Rooflines,
    set: &roofline::RooflineSet,
    kind: Kind,
    shapes: &[Shape],
    reps: usize,
) -> Res<Vec<Tried>> {
    rooflines.prepare(kind, shapes, true)?;
    let jobs: Vec<measure::Job> = shapes
        .iter()
        .map(|shape| {
            Box::new(move |pass: &mut wgpu::ComputePass| {
                rooflines.record(set, pass, kind, shape, true)
            }) as measure::Job
        })
        .collect();
    let samples = bench.time_jobs(&jobs, reps, 1)?;
    let bytes = set.bytes(kind) as f64;
    let mut tried: Vec<Tried> = shapes
        .iter()
        .zip(samples)
        .map(|(shape, mut s)| {
            let seconds = median(&mut s);
            let min_seconds = min_of(&s);
            Tried {
                kind,
                shape: *shape,
                label: shape.label(),
                seconds,
                gbps: bytes / seconds * 1e-9,
                min_seconds,
                min_gbps: bytes / min_seconds * 1e-9,
            }
        })
        .collect();
    tried.sort_by(|a, b| a.min_seconds.total_cmp(&b.min_seconds));
    Ok(tried)
}

/// The float64 references of every norm.
fn reference(norm: NormKind, x: &[f32]) -> f64 {
    match norm {
        NormKind::L2 => x.iter().map(|&g| g as f64 * g as f64).sum::<f64>().sqrt(),
        NormKind::Inf => x.iter().fold(0.0f64, |m, &g| m.max(g.abs() as f64)),
        NormKind::P3 | NormKind::P1_5 | NormKind::P4_5 => {
            let p = norm.p().unwrap();
            let sum = x.iter().map(|&g| (g.abs() as f64).powf(p)).sum::<f64>();
            sum.powf(1.0 / p)
        }
    }
}

/// Relative tolerance of gradclip's norms against the float64 reference.
fn tolerance(norm: NormKind) -> f64 {
    match norm {
        NormKind::L2 | NormKind::P3 | NormKind::P1_5 | NormKind::P4_5 => 1e-4,
        NormKind::Inf => 0.0,
    }
}

fn main() -> Res<()> {
    let mut args = Args::parse();
    if args.quick {
        args.warmup = args.warmup.min(1);
    }
    if args.targets {
        if args.sizes.is_empty() {
            args.sizes = TARGET_SIZES.iter().map(|n| n.to_string()).collect();
        }
        if args.tensors.is_empty() {
            args.tensors = TARGET_TENSORS.to_vec();
        }
        if args.norms.is_empty() {
            args.norms = TARGET_NORMS.to_vec();
        }
        args.tensor_norms = true;
        args.one_element.get_or_insert(TARGET_ONE_ELEMENT);
    }
    if args.tensors.is_empty() {
        args.tensors = DEFAULT_TENSORS.to_vec();
    }
    if args.norms.is_empty() {
        args.norms = DEFAULT_NORMS.to_vec();
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
        "adapter: {} ({:?}, {:?}, driver {} {}); SUBGROUP {}, subgroup sizes {}..{}",
        info.name,
        info.backend,
        info.device_type,
        info.driver,
        info.driver_info,
        if adapter.subgroup { "yes" } else { "no" },
        info.subgroup_min_size,
        info.subgroup_max_size
    );
    if args.sweep {
        return sweep::run(&args, &bench, adapter, &sizes);
    }
    let rooflines = if args.no_roofline {
        None
    } else {
        Some(Rooflines::new(&bench.device, &bench.queue)?)
    };
    let shapes = match &rooflines {
        Some(r) => candidates(&args, r, false)?,
        None => Vec::new(),
    };
    // The records kernel only where the tensor-norms step is timed, and
    // only with vec4 loads: the read's candidates, tuned per tensor count.
    let record_shapes: Vec<Shape> = if args.tensor_norms {
        shapes
            .iter()
            .copied()
            .filter(|s| Rooflines::has(Kind::Records, s))
            .collect()
    } else {
        Vec::new()
    };
    if args.tensor_norms && !shapes.is_empty() && record_shapes.is_empty() {
        return Err("no roofline shape with vec4 loads for the records kernel".into());
    }
    // (N, tensor counts) of every case, the one-element case merged in.
    let mut groups: Vec<(u64, Vec<usize>)> =
        sizes.iter().map(|&n| (n, args.tensors.clone())).collect();
    if let Some(k) = args.one_element.filter(|&k| k > 0) {
        add_case(&mut groups, k as u64, k);
    }
    // Model layouts, by their (N, tensors) case.
    let mut layouts = BTreeMap::new();
    for model in &args.model {
        let sizes = model.sizes()?;
        let (n, t) = (sizes.iter().sum::<usize>() as u64, sizes.len());
        add_case(&mut groups, n, t);
        eprintln!("{model:?}: N = {n}, {t} tensors");
        layouts.insert((n, t), sizes);
    }
    groups.sort_by_key(|g| g.0);
    eprintln!(
        "timing: {}; per-pass GPU timestamps: {}; cases {:?}, norms {:?}, tensor norms {}, {} reps after {} warm-up; rooflines: {}",
        if bench.gpu_basis { "GPU timestamps" } else { "wall clock around submit + wait" },
        if bench.timestamps { "yes" } else { "no" },
        groups,
        args.norms,
        if args.tensor_norms { "too" } else { "no" },
        bench.reps,
        bench.warmup,
        if rooflines.is_some() {
            format!("the fastest of {} shapes per kind and N", shapes.len())
        } else {
            "none".into()
        }
    );
    let started = Instant::now();
    let clipper = gradclip::Clipper::new(&bench.device, &bench.queue)?;
    let naive = naive::Naive::new(&bench.device, &bench.queue);
    let mut copies = Vec::new();
    let mut roofline_results = Vec::new();
    let mut results = Vec::new();

    for (n, tensor_counts) in &groups {
        let n = *n;
        let host = gradient(n as usize);
        let storage = wgpu::BufferUsages::STORAGE;
        let copy_usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let b = Buffers {
            n,
            pristine: bench
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("bench pristine gradients"),
                    contents: bytemuck::cast_slice(&host),
                    usage: copy_usage,
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

        // The rooflines of this N: every candidate checked on ones, then
        // the fastest read and multiply shape kept.
        let roof = match &rooflines {
            Some(r) if Rooflines::fits(&bench.device, n) => {
                // Room for the most records a case of this N writes (none
                // without --tensor-norms).
                let records_capacity = tensor_counts
                    .iter()
                    .map(|&t| t as u64)
                    .filter(|&t| t <= n && Rooflines::fits_records(&bench.device, t))
                    .max()
                    .filter(|_| !record_shapes.is_empty())
                    .unwrap_or(0);
                let set = r.bind(&b.grads, n, records_capacity as u32);
                // The power kernel only where a case has a general p (the
                // bench has one, 1.5), and only with vec4 loads.
                let general_p = args.norms.iter().find_map(|norm| norm.general_p());
                let power_shapes: Vec<Shape> = match general_p {
                    Some(_) => shapes
                        .iter()
                        .copied()
                        .filter(|s| Rooflines::has(Kind::Power, s))
                        .collect(),
                    None => Vec::new(),
                };
                if let Some(p) = general_p {
                    if power_shapes.is_empty() {
                        return Err("no roofline shape with vec4 loads for the power kernel".into());
                    }
                    r.set_power(&set, p as f32);
                }
                r.prepare(Kind::Read, &shapes, true)?;
                r.prepare(Kind::Multiply, &shapes, true)?;
                r.prepare(Kind::Power, &power_shapes, true)?;
                with_ones(&bench, &b, || {
                    r.validate(&set, &shapes, &shapes, &power_shapes, &[], true)
                })?;
                let reads = tune(&bench, r, &set, Kind::Read, &shapes, args.tune_reps)?;
                let muls = tune(&bench, r, &set, Kind::Multiply, &shapes, args.tune_reps)?;
                let powers = if power_shapes.is_empty() {
                    Vec::new()
                } else {
                    let p = tune(&bench, r, &set, Kind::Power, &power_shapes, args.tune_reps)?;
                    eprintln!(
                        "N = {n}: power roofline (p = {}) {} ({:.1} GB/s fastest, {:.1} median)",
                        general_p.unwrap_or(f64::NAN),
                        p[0].label,
                        p[0].min_gbps,
                        p[0].gbps
                    );
                    p
                };
                eprintln!(
                    "N = {n}: read roofline {} ({:.1} GB/s fastest, {:.1} median of {}), multiply roofline {} ({:.1} GB/s fastest, {:.1} median)",
                    reads[0].label,
                    reads[0].min_gbps,
                    reads[0].gbps,
                    args.tune_reps,
                    muls[0].label,
                    muls[0].min_gbps,
                    muls[0].gbps
                );
                Some((set, reads, muls, powers))
            }
            Some(_) => {
                eprintln!("N = {n}: no rooflines (the buffer is larger than one binding)");
                None
            }
            None => None,
        };

        let mut work = if args.no_cpu {
            Vec::new()
        } else {
            vec![0.0f32; n as usize]
        };
        let (mut copy_medians, mut host_medians) = (Vec::new(), Vec::new());
        let (mut read_medians, mut mul_medians) = (Vec::new(), Vec::new());
        let mut power_medians = Vec::new();
        let mut records_results = Vec::new();

        for &t in tensor_counts {
            if t == 0 || t as u64 > n {
                continue;
            }
            let tensor_sizes = layouts
                .get(&(n, t))
                .cloned()
                .unwrap_or_else(|| even_sizes(n, t));
            let layout = gradclip::GradLayout::from_sizes(&tensor_sizes)?;
            let set = clipper.bind(&b.grads, &layout)?;
            let naive_set = (args.naive != NaiveCases::None
                && t <= NAIVE_MAX_TENSORS
                && naive::Naive::fits(&bench.device, n))
            .then(|| naive.bind(&b.grads, &tensor_sizes));
            let ranges: Vec<_> = (0..t)
                .map(|i| {
                    let r = layout.range(i);
                    r.start as usize..r.end as usize
                })
                .collect();
            // With --spread, this layout's tensors scaled, in the pristine
            // copy every repetition restores.
            let host = if args.spread > 0.0 {
                let scaled = spread(&host, &ranges, args.spread);
                bench
                    .queue
                    .write_buffer(&b.pristine, 0, bytemuck::cast_slice(&scaled));
                bench.restore(&b)?;
                std::borrow::Cow::Owned(scaled)
            } else {
                std::borrow::Cow::Borrowed(&host[..])
            };
            // The records kernel of this tensor count: checked on ones and
            // tuned with the count set, before the case's repetitions.
            let records_tried = match (&rooflines, &roof) {
                (Some(r), Some((set, ..))) if !record_shapes.is_empty() => {
                    if t as u64 <= set.records_capacity as u64 {
                        r.set_records(set, t as u32)?;
                        r.prepare(Kind::Records, &record_shapes, true)?;
                        with_ones(&bench, &b, || {
                            r.validate(set, &[], &[], &[], &record_shapes, true)
                        })?;
                        let tried = tune(
                            &bench,
                            r,
                            set,
                            Kind::Records,
                            &record_shapes,
                            args.tune_reps,
                        )?;
                        eprintln!(
                            "N = {n}, {t} tensors: records roofline {} ({:.1} GB/s fastest, {:.1} median)",
                            tried[0].label, tried[0].min_gbps, tried[0].gbps
                        );
                        Some(tried)
                    } else {
                        eprintln!(
                            "N = {n}, {t} tensors: no records roofline (the records are larger than one binding)"
                        );
                        None
                    }
                }
                _ => None,
            };
            let mut records_medians = Vec::new();
            // The L2 norm of the p cases' plain L2 step, timed beside them
            // (/ L2, paired).
            let l2_of_p_cases = args
                .norms
                .iter()
                .any(|n| n.p().is_some())
                .then(|| reference(NormKind::L2, &host));
            for &norm in &args.norms {
                let total = reference(norm, &host);
                let tol = tolerance(norm);
                let l2_total = l2_of_p_cases.filter(|_| norm.p().is_some());
                let per_tensor: Vec<f64> = if args.tensor_norms {
                    ranges
                        .iter()
                        .map(|r| reference(norm, &host[r.clone()]))
                        .collect()
                } else {
                    Vec::new()
                };
                for step in [Step::Clip, Step::Noclip] {
                    let max_norm = step.max_norm(total);
                    let case = Case {
                        n,
                        tensors: t,
                        norm,
                        step,
                    };
                    let mut m = bench.run_case(CaseInputs {
                        buffers: &b,
                        set: &set,
                        tensor_norms: args.tensor_norms,
                        whole_step: args.whole_step,
                        roofline: roof
                            .as_ref()
                            .map(|(set, reads, muls, powers)| RooflineCase {
                                rooflines: rooflines.as_ref().expect("rooflines exist"),
                                set,
                                read: reads[0].shape,
                                multiply: muls[0].shape,
                                power: norm
                                    .general_p()
                                    .and_then(|p| Some((powers.first()?.shape, p as f32))),
                                records: records_tried
                                    .as_ref()
                                    .map(|tried| (tried[0].shape, t as u32)),
                            }),
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
                        l2_beside: l2_total.map(|l2| step.max_norm(l2)),
                    })?;
                    // Taken before the medians below sort the samples.
                    let scaled = |v: &[f64], kind: Kind, bytes: u64| -> Option<Vec<f64>> {
                        let (set, ..) = roof.as_ref()?;
                        let f = bytes as f64 / set.bytes(kind) as f64;
                        Some(v.iter().map(|t| t * f).collect())
                    };
                    let read_reps = scaled(&m.read_roofline, Kind::Read, 4 * n);
                    let multiply_reps = scaled(&m.multiply_roofline, Kind::Multiply, 8 * n);
                    let plain_reps = basis(&m.gradclip.0, bench.gpu_basis).to_vec();
                    let l2_reps = match (&m.l2_beside, l2_total) {
                        (Some((s, out)), Some(l2)) => {
                            let l2_case = Case {
                                norm: NormKind::L2,
                                ..case
                            };
                            l2_case.check(
                                "gradclip (L2 beside)",
                                l2,
                                *out,
                                tolerance(NormKind::L2),
                            )?;
                            Some(basis(s, bench.gpu_basis).to_vec())
                        }
                        _ => None,
                    };
                    let paired = PairedReps {
                        roof: read_reps.as_deref().zip(multiply_reps.as_deref()),
                        plain: &plain_reps,
                        l2: l2_reps.as_deref(),
                    };
                    let copy_seconds = median(&mut m.copy);
                    copy_medians.push(copy_seconds);
                    let device_copy = ("device copy", 8.0 * n as f64 / copy_seconds * 1e-9);
                    let rates = roof.as_ref().map(|(set, _, _, _)| {
                        let (read_fastest, multiply_fastest) =
                            (min_of(&m.read_roofline), min_of(&m.multiply_roofline));
                        let read = median(&mut m.read_roofline);
                        let multiply = median(&mut m.multiply_roofline);
                        read_medians.push(read);
                        mul_medians.push(multiply);
                        let power =
                            (!m.power_roofline.is_empty()).then(|| median(&mut m.power_roofline));
                        power_medians.extend(power);
                        let records = records_tried
                            .as_ref()
                            .filter(|_| !m.records_roofline.is_empty())
                            .map(|tried| {
                                let seconds = median(&mut m.records_roofline);
                                records_medians.push(seconds);
                                RecordsRate {
                                    seconds,
                                    gbps: set.bytes(Kind::Records) as f64 / seconds * 1e-9,
                                    shape: tried[0].shape,
                                }
                            });
                        RoofRates {
                            read_gbps: set.bytes(Kind::Read) as f64 / read * 1e-9,
                            read_seconds: read,
                            read_fastest,
                            multiply_fastest,
                            multiply_gbps: set.bytes(Kind::Multiply) as f64 / multiply * 1e-9,
                            power_gbps: power.map(|t| set.bytes(Kind::Power) as f64 / t * 1e-9),
                            records,
                        }
                    });
                    // The records roofline goes with the tensor-norms row only.
                    let plain_rates = rates.map(|r| RoofRates { records: None, ..r });
                    case.check("gradclip", total, m.gradclip.1, tol)?;
                    results.push(case.result(
                        "gradclip",
                        bench.gpu_basis,
                        m.gradclip,
                        device_copy,
                        plain_rates,
                        Some(&paired),
                    ));
                    if let Some((samples, out, tensor_norms)) = m.tensor_norms {
                        case.check("gradclip-tensor-norms", total, out, tol)?;
                        case.check_tensor_norms(&tensor_norms, &per_tensor, tol)?;
                        results.push(case.result(
                            "gradclip-tensor-norms",
                            bench.gpu_basis,
                            (samples, out),
                            device_copy,
                            rates,
                            Some(&paired),
                        ));
                    }
                    if let Some(out) = m.whole_step {
                        case.check("gradclip-whole", total, out.1, tol)?;
                        results.push(case.result(
                            "gradclip-whole",
                            bench.gpu_basis,
                            out,
                            device_copy,
                            plain_rates,
                            Some(&paired),
                        ));
                    }
                    if let Some(out) = m.naive {
                        case.check("naive", total, out.1, tol.max(1e-3))?;
                        results.push(case.result(
                            "naive",
                            bench.gpu_basis,
                            out,
                            device_copy,
                            plain_rates,
                            Some(&paired),
                        ));
                    }
                    if let Some(out) = m.cpu {
                        let host_seconds = median(&mut m.host_copy);
                        host_medians.push(host_seconds);
                        let host_copy = ("host copy", 8.0 * n as f64 / host_seconds * 1e-9);
                        case.check("cpu", total, out.1, tol.max(1e-3))?;
                        results.push(case.result("cpu", false, out, host_copy, None, None));
                    }
                    eprint!(".");
                }
            }
            if let (Some(tried), Some((set, ..))) = (records_tried, &roof) {
                if !records_medians.is_empty() {
                    let seconds = median(&mut records_medians);
                    let bytes = set.bytes(Kind::Records);
                    records_results.push(RecordsRoofline {
                        tensors: t,
                        kernel: RooflineKernel {
                            shape: tried[0].shape,
                            label: tried[0].label.clone(),
                            bytes,
                            seconds,
                            gbps: bytes as f64 / seconds * 1e-9,
                        },
                        tried,
                    });
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
        let mut roofline_note = String::new();
        if let Some((set, reads, muls, powers)) = roof {
            let kernel = |kind: Kind, tried: &Tried, medians: &mut Vec<f64>| {
                let seconds = median(medians);
                let bytes = set.bytes(kind);
                RooflineKernel {
                    shape: tried.shape,
                    label: tried.label.clone(),
                    bytes,
                    seconds,
                    gbps: bytes as f64 / seconds * 1e-9,
                }
            };
            let r = RooflineResult {
                n,
                read: kernel(Kind::Read, &reads[0], &mut read_medians),
                multiply: kernel(Kind::Multiply, &muls[0], &mut mul_medians),
                power: match powers.first() {
                    Some(p) if !power_medians.is_empty() => {
                        Some(kernel(Kind::Power, p, &mut power_medians))
                    }
                    _ => None,
                },
                records: records_results,
                tried: reads.into_iter().chain(muls).chain(powers).collect(),
            };
            roofline_note = format!(
                ", read roofline {:.1} GB/s, multiply roofline {:.1} GB/s{}{}",
                r.read.gbps,
                r.multiply.gbps,
                r.power.as_ref().map_or(String::new(), |p| format!(
                    ", power roofline {:.1} GB/s",
                    p.gbps
                )),
                r.records
                    .iter()
                    .map(|k| format!(
                        ", records roofline {:.1} GB/s ({} records)",
                        k.kernel.gbps, k.tensors
                    ))
                    .collect::<String>()
            );
            roofline_results.push(r);
        }
        eprintln!(
            " N = {n}: device copy {:.1} GB/s{}{roofline_note}",
            copy.gbps,
            copy.host_gbps
                .map_or(String::new(), |g| format!(", host copy {g:.1} GB/s"))
        );
        copies.push(copy);
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());

    let run = Run {
        schema: SCHEMA,
        tool: "gradclip",
        date_utc: date_utc(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        adapter,
        basis: if bench.gpu_basis { "gpu" } else { "wall" },
        reps: bench.reps,
        warmup: bench.warmup,
        copy: copies,
        rooflines: roofline_results,
        results,
    };
    print!("{}", report::markdown(&run));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&run)?)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        plot::svg(&run, &report::plot_title(&run), path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-repetition pass samples on the GPU basis.
    fn samples(total: &[f64], reduce: &[f64], scale: &[f64]) -> Samples {
        Samples {
            wall: total.to_vec(),
            record: Vec::new(),
            passes: [("reduce", reduce), ("scale", scale)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            gpu_total: total.to_vec(),
        }
    }

    fn rates(read_seconds: f64, multiply_seconds: f64, n: u64) -> RoofRates {
        RoofRates {
            read_gbps: 4.0 * n as f64 / read_seconds * 1e-9,
            read_seconds,
            read_fastest: read_seconds,
            multiply_fastest: multiply_seconds,
            multiply_gbps: 8.0 * n as f64 / multiply_seconds * 1e-9,
            power_gbps: None,
            records: None,
        }
    }

    #[test]
    fn paired_ratio_is_the_median_of_each_repetitions_ratio() {
        // Medians alone: 4 / 2 = 2; paired: each repetition 1, 1, 1.
        assert_eq!(paired_ratio(&[1.0, 4.0, 8.0], &[1.0, 4.0, 8.0]), Some(1.0));
        assert_eq!(paired_ratio(&[2.0, 9.0, 3.0], &[1.0, 3.0, 2.0]), Some(2.0));
        assert_eq!(paired_ratio(&[1.0, 2.0], &[1.0]), None);
        assert_eq!(paired_ratio(&[], &[]), None);
    }

    /// A host that runs each repetition at its own speed, and a pass that
    /// stalls once: the paired fractions and tensor norms / plain see
    /// through the host's speed and the one stall, where medians of each
    /// side taken apart do not. Also guards the order: pairs taken after
    /// anything sorted the samples come out wrong here.
    #[test]
    fn paired_figures_pair_each_repetition() {
        let case = Case {
            n: 1000,
            tensors: 10,
            norm: NormKind::L2,
            step: Step::Clip,
        };
        // Repetition speeds 1, 3, 2: the reduce at 80% of the read
        // roofline and the scale at 90% of the multiply one in each, but
        // for the reduce's stall in the first (0.16); the per-tensor step
        // 1.1x the plain one in each but the first (6.7x).
        let speed = [1.0, 3.0, 2.0];
        let read: Vec<f64> = speed.iter().map(|s| 0.8 * s).collect();
        let multiply: Vec<f64> = speed.iter().map(|s| 0.9 * 2.0 * s).collect();
        let reduce = [5.0, 3.0, 2.0];
        let scale: Vec<f64> = speed.iter().map(|s| 2.0 * s).collect();
        let plain: Vec<f64> = speed.iter().map(|s| 3.0 * s).collect();
        let tn = [20.0, 9.9, 6.6];
        let paired = PairedReps {
            roof: Some((&read, &multiply)),
            plain: &plain,
            l2: None,
        };
        let roof = Some(rates(1.6, 3.6, case.n));
        // One implementation's row, with the same passes for every row.
        let row = |implementation: &str, total: &[f64], paired: &PairedReps| {
            let s = (samples(total, &reduce, &scale), (1.0, 1.0));
            case.result(
                implementation,
                true,
                s,
                ("device copy", 1.0),
                roof,
                Some(paired),
            )
        };
        let r = row("gradclip", &plain, &paired);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // Medians: 1.6 / 3; sorted, then paired: 0.48.
        assert!(close(r.pass_roofline_fractions["reduce"], 1.6 / 3.0));
        assert!(close(r.pass_roofline_fractions_paired["reduce"], 0.8));
        assert!(close(r.pass_roofline_fractions_paired["scale"], 0.9));
        assert_eq!(
            r.over_plain_paired, None,
            "a plain row has no tensor norms / plain"
        );
        let t = row("gradclip-tensor-norms", &tn, &paired);
        // Medians: 9.9 / 6 = 1.65; sorted, then paired: 2.2.
        assert!(close(t.seconds / r.seconds, 1.65));
        assert!(close(t.over_plain_paired.unwrap(), 1.1));
        assert_eq!(t.over_l2_paired, None, "no L2 step was timed beside it");
        // A p step twice the L2 step beside it in each repetition but the
        // last, where the L2 step stalled: paired 2; medians 6 / 4.5.
        let l2 = [1.5, 4.5, 30.0];
        let beside = PairedReps {
            l2: Some(&l2),
            ..paired
        };
        let p = row("gradclip", &plain, &beside);
        assert!(close(p.over_l2_paired.unwrap(), 2.0));
    }
}
