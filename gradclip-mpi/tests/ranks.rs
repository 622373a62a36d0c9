//! The multi-process suite. Run by `cargo test`, this binary starts itself
//! under `mpirun -np 2` and `-np 4` (each rank makes its own wgpu device,
//! on the adapter `WGPU_BACKEND` picks) and fails if either run fails or
//! outlives its time limit. Under mpirun, every rank runs the cases below in
//! the same order; a failed assertion aborts the whole MPI job, and a
//! watchdog ends a rank whose case runs past its limit, so a deadlock is a
//! failure, never a hung CI.
//!
//! Every case compares each rank's clipped shard with the same elements of
//! the concatenation clipped in one process (on the rank's own device) and
//! with a float64 CPU reference, and checks that every rank reached the same
//! result bit for bit.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gradclip::{ClipNorm, Clipper, GradLayout, GradSet, GradType, LossScaler, Norm, Semantics};
use gradclip_mpi::{Error, Exchange, ReplicatedSet, ShardPlan, ShardedSet};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

/// Seconds one `mpirun` may take (4 ranks on two cores of CPU Vulkan).
const RUN_LIMIT_S: u64 = 900;
/// Seconds one case may take on a rank before the watchdog calls it a hang.
const CASE_LIMIT_S: u64 = 240;
/// Per-element tolerance, relative.
const TOL: f64 = 1e-6;

fn main() {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() {
        launch();
    } else {
        ranks();
    }
}

// ---------------------------------------------------------------- launcher

fn launch() {
    let exe = std::env::current_exe().expect("the test binary's path");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    for np in [2, 4] {
        let started = Instant::now();
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=10", &RUN_LIMIT_S.to_string(), "mpirun"]);
        cmd.arg("--oversubscribe");
        if root {
            cmd.arg("--allow-run-as-root");
        }
        cmd.args(["-np", &np.to_string()]).arg(&exe);
        println!("== {cmd:?}");
        let status = cmd
            .status()
            .expect("run `timeout` and `mpirun` (install coreutils and openmpi-bin)");
        println!(
            "== mpirun -np {np}: {status} in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        assert!(
            status.success(),
            "mpirun -np {np} failed ({status}; 124 = timed out)"
        );
    }
}

// ---------------------------------------------------------------- watchdog

static CASE: Mutex<&str> = Mutex::new("start");
static CASE_STARTED: AtomicU64 = AtomicU64::new(0);

fn now_s(epoch: Instant) -> u64 {
    epoch.elapsed().as_secs()
}

fn start_watchdog(rank: i32) -> Instant {
    let epoch = Instant::now();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        let since = now_s(epoch) - CASE_STARTED.load(Ordering::Relaxed);
        if since > CASE_LIMIT_S {
            let case = *CASE.lock().unwrap_or_else(|e| e.into_inner());
            eprintln!("rank {rank}: case `{case}` still running after {since} s: a hang");
            // Exiting without MPI_Finalize makes mpirun end every rank.
            std::process::exit(124);
        }
    });
    epoch
}

struct Ctx {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    device: wgpu::Device,
    queue: wgpu::Queue,
    clipper: Clipper,
    epoch: Instant,
}

impl Ctx {
    fn case(&self, name: &'static str, run: impl FnOnce(&Ctx)) {
        *CASE.lock().unwrap_or_else(|e| e.into_inner()) = name;
        CASE_STARTED.store(now_s(self.epoch), Ordering::Relaxed);
        let started = Instant::now();
        run(self);
        // Nobody starts the next case until every rank has passed this one.
        self.world.barrier();
        if self.rank == 0 {
            println!(
                "np {}: {name} ok ({:.2} s)",
                self.size,
                started.elapsed().as_secs_f64()
            );
        }
    }
}

fn ranks() {
    let universe = mpi::initialize().expect("MPI initialises once");
    let world = universe.world();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        // A failed assertion on one rank must not leave the others waiting.
        SimpleCommunicator::world().abort(101);
    }));
    let epoch = start_watchdog(world.rank());
    let (device, queue, info) =
        pollster::block_on(gradclip::default_device()).expect("a wgpu adapter on every rank");
    if world.rank() == 0 {
        println!(
            "np {}: adapter {} ({:?})",
            world.size(),
            info.name,
            info.backend
        );
    }
    let clipper = Clipper::new(&device, &queue).expect("the clipper's pipelines");
    let ctx = Ctx {
        rank: world.rank() as usize,
        size: world.size() as usize,
        world,
        device,
        queue,
        clipper,
        epoch,
    };

    ctx.case("every norm and semantics, uneven shards", every_norm);
    ctx.case("NaN and inf on one rank", nonfinite_on_one_rank);
    ctx.case(
        "error_if_nonfinite refuses on every rank",
        refuse_everywhere,
    );
    ctx.case("a failing rank fails every rank", failing_rank);
    ctx.case("loss scaling agrees", loss_scaling);
    ctx.case("bf16 with loss scaling, odd cuts", bf16_loss_scaling);
    ctx.case("per-tensor norms and clips", per_tensor);
    ctx.case("replicated ranks agree", replicated);
}

// ---------------------------------------------------------------- data

/// The model's gradient tensors: a zero-size one, a tiny one, one that no
/// chunk boundary fits.
const SIZES: [usize; 6] = [1000, 37, 0, 5000, 3, 2500];

fn global() -> GradLayout {
    GradLayout::from_sizes(&SIZES).unwrap()
}

/// The same pseudo-random gradients on every rank, with magnitudes varying
/// by tensor.
fn concatenation() -> Vec<f32> {
    let layout = global();
    let mut out = Vec::new();
    for t in 0..layout.len() {
        let scale = [0.1f32, 1.0, 10.0][t % 3];
        for i in layout.range(t) {
            let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
            x ^= x >> 29;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x ^= x >> 32;
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            out.push((2.0 * unit - 1.0) * scale);
        }
    }
    out
}

/// Plans for the communicator's size: uneven cuts with an empty shard, and
/// torch.chunk's even cut.
fn plans(size: usize) -> Vec<ShardPlan> {
    let n = global().total_elements();
    let uneven = match size {
        2 => vec![vec![0, 1234, n], vec![0, n, n]],
        4 => vec![vec![0, 900, 900, 6001, n], vec![0, 1, 2, 3, n]],
        _ => vec![],
    };
    let mut plans: Vec<ShardPlan> = uneven
        .into_iter()
        .map(|b| ShardPlan::from_bounds(&global(), b).unwrap())
        .collect();
    plans.push(ShardPlan::even(&global(), size).unwrap());
    plans
}

fn storage(ctx: &Ctx, data: &[f32]) -> wgpu::Buffer {
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test gradients"),
        size: (4 * data.len()).max(4) as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.queue
        .write_buffer(&buffer, 0, bytemuck::cast_slice(data));
    buffer
}

fn read(ctx: &Ctx, buffer: &wgpu::Buffer, len: usize) -> Vec<f32> {
    bytemuck::cast_slice(&read_words(ctx, buffer, len)).to_vec()
}

/// The first `len` 4-byte words of `buffer`.
fn read_words(ctx: &Ctx, buffer: &wgpu::Buffer, len: usize) -> Vec<u32> {
    if len == 0 {
        return Vec::new();
    }
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test readback"),
        size: 4 * len as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, 4 * len as u64);
    ctx.queue.submit([encoder.finish()]);
    staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let out = bytemuck::cast_slice(&staging.get_mapped_range(..).expect("mapped")[..]).to_vec();
    staging.unmap();
    out
}

/// This rank's sharded set over `data`'s elements of the plan.
fn sharded(ctx: &Ctx, plan: &ShardPlan, data: &[f32]) -> (ShardedSet, wgpu::Buffer, Vec<f32>) {
    let shard = plan.shard(ctx.rank).unwrap();
    let own = plan.elements(ctx.rank);
    let mine = data[own.start as usize..own.end as usize].to_vec();
    let buffer = storage(ctx, &mine);
    let set = ctx.clipper.bind(&buffer, shard.layout()).unwrap();
    let set = ShardedSet::new(&ctx.world, &ctx.device, &ctx.queue, set, &shard).unwrap();
    (set, buffer, mine)
}

/// `data` clipped in one process on this rank's device: the gradients and
/// the report.
fn single(ctx: &Ctx, data: &[f32], clip: &ClipNorm) -> (Vec<f32>, gradclip::ClipReport) {
    let buffer = storage(ctx, data);
    let set = ctx.clipper.bind(&buffer, &global()).unwrap();
    single_on(ctx, &set, &buffer, data, clip)
}

fn single_on(
    ctx: &Ctx,
    set: &GradSet,
    buffer: &wgpu::Buffer,
    data: &[f32],
    clip: &ClipNorm,
) -> (Vec<f32>, gradclip::ClipReport) {
    ctx.queue
        .write_buffer(buffer, 0, bytemuck::cast_slice(data));
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, clip).unwrap();
    ctx.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report());
    let report = report.unwrap_or_else(|e| panic!("single-process clip {clip:?}: {e}"));
    (read(ctx, buffer, data.len()), report)
}

/// The float64 reference of a global clip of `data`.
fn reference(data: &[f32], clip: &ClipNorm) -> Vec<f64> {
    let g: Vec<f64> = data.iter().map(|&x| x as f64).collect();
    let total = match clip.norm_order() {
        Norm::L1 => g.iter().map(|x| x.abs()).sum(),
        Norm::L2 => g.iter().map(|x| x * x).sum::<f64>().sqrt(),
        Norm::Inf => g.iter().fold(0.0f64, |m, x| m.max(x.abs())),
        Norm::P(p) => {
            let p = p as f64;
            g.iter().map(|x| x.abs().powf(p)).sum::<f64>().powf(1.0 / p)
        }
    };
    let max = clip.max_norm() as f64;
    let coefficient = match clip.semantics() {
        Semantics::Torch => (max / (total + 1e-6)).min(1.0),
        Semantics::TensorFlow if total == 0.0 => 1.0,
        Semantics::TensorFlow => max * (1.0 / total).min(1.0 / max),
    };
    g.iter().map(|x| x * coefficient).collect()
}

/// Equal within [`TOL`], relative to each element; NaN matches NaN.
fn assert_close(what: &str, got: &[f32], want: impl IntoIterator<Item = f64>) {
    let want: Vec<f64> = want.into_iter().collect();
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let g = g as f64;
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= TOL * w.abs();
        assert!(ok, "{what}: element {i} is {g}, expected {w}");
    }
}

/// Every rank's `words`, checked equal to rank 0's.
fn assert_same_everywhere(ctx: &Ctx, what: &str, words: &[u32]) {
    let mut all = vec![0u32; words.len() * ctx.size];
    ctx.world.all_gather_into(words, &mut all[..]);
    for (rank, theirs) in all.chunks_exact(words.len()).enumerate() {
        assert_eq!(
            theirs,
            &all[..words.len()],
            "{what}: rank {rank} differs from rank 0"
        );
    }
}

fn step_words(step: &gradclip_mpi::Step, report: &gradclip::ClipReport) -> Vec<u32> {
    let mut words: Vec<u32> = bytemuck::cast::<_, [u32; 4]>(step.combined.to_bytes()).to_vec();
    let bits = step.total_norm.to_bits();
    words.extend([bits as u32, (bits >> 32) as u32]);
    words.extend([
        report.total_norm.to_bits(),
        report.coefficient.to_bits(),
        report.found_inf as u32,
        report.loss_scale.to_bits(),
    ]);
    words
}

fn own<'a>(plan: &ShardPlan, rank: usize, all: &'a [f32]) -> &'a [f32] {
    let r = plan.elements(rank);
    &all[r.start as usize..r.end as usize]
}

fn own64(plan: &ShardPlan, rank: usize, all: &[f64]) -> Vec<f64> {
    let r = plan.elements(rank);
    all[r.start as usize..r.end as usize].to_vec()
}

/// One sharded step: re-upload this rank's data, clip, submit, read back.
fn sharded_step(
    ctx: &Ctx,
    set: &ShardedSet,
    buffer: &wgpu::Buffer,
    mine: &[f32],
    clip: &ClipNorm,
) -> (gradclip_mpi::Result<gradclip_mpi::Step>, Vec<f32>) {
    ctx.queue
        .write_buffer(buffer, 0, bytemuck::cast_slice(mine));
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let step = set.clip_norm(&mut encoder, clip);
    ctx.queue.submit([encoder.finish()]);
    (step, read(ctx, buffer, mine.len()))
}

// ---------------------------------------------------------------- cases

fn every_norm(ctx: &Ctx) {
    let data = concatenation();
    let mut clips = Vec::new();
    for norm in [Norm::L2, Norm::Inf, Norm::L1, Norm::P(3.0)] {
        clips.push(ClipNorm::new(1.0).norm(norm));
        clips.push(ClipNorm::tensorflow(1.0).norm(norm));
    }
    // Nothing to clip: the factor is exactly 1.
    clips.push(ClipNorm::new(1e6));
    clips.push(ClipNorm::tensorflow(1e6).norm(Norm::P(3.0)));
    for (p, plan) in plans(ctx.size).iter().enumerate() {
        for exchange in [Exchange::AllGather, Exchange::AllReduce] {
            let (set, buffer, mine) = sharded(ctx, plan, &data);
            let set = set.with_exchange(exchange);
            for clip in &clips {
                let what = format!("plan {p}, {exchange:?}, {clip:?}, rank {}", ctx.rank);
                let (step, got) = sharded_step(ctx, &set, &buffer, &mine, clip);
                let step = step.unwrap_or_else(|e| panic!("{what}: {e}"));
                let (whole, whole_report) = single(ctx, &data, clip);
                assert_close(
                    &format!("{what} vs one process"),
                    &got,
                    own(plan, ctx.rank, &whole).iter().map(|&x| x as f64),
                );
                assert_close(
                    &format!("{what} vs float64"),
                    &got,
                    own64(plan, ctx.rank, &reference(&data, clip)),
                );
                let report = pollster::block_on(set.set().read_report()).unwrap();
                let norm_error = (report.total_norm as f64 - whole_report.total_norm as f64).abs();
                assert!(
                    norm_error <= TOL * whole_report.total_norm as f64,
                    "{what}: norm {} vs one process {}",
                    report.total_norm,
                    whole_report.total_norm
                );
                assert_same_everywhere(ctx, &what, &step_words(&step, &report));
            }
        }
    }
}

fn nonfinite_on_one_rank(ctx: &Ctx) {
    let plan = &plans(ctx.size)[0];
    for bad in [f32::NAN, f32::INFINITY] {
        let mut data = concatenation();
        // On the last rank, whose shard is never empty.
        let at = plan.elements(ctx.size - 1).start as usize + 1;
        data[at] = bad;
        let (set, buffer, mine) = sharded(ctx, plan, &data);
        for clip in [
            ClipNorm::new(1.0),
            ClipNorm::tensorflow(1.0),
            ClipNorm::new(1.0).norm(Norm::Inf),
        ] {
            let what = format!("{bad} at {at}, {clip:?}, rank {}", ctx.rank);
            let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
            let step = step.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                step.nonfinite,
                "{what}: every rank sees the non-finite element"
            );
            let (whole, _) = single(ctx, &data, &clip);
            assert_close(
                &what,
                &got,
                own(plan, ctx.rank, &whole).iter().map(|&x| x as f64),
            );
            if bad.is_nan() || clip.semantics() == Semantics::TensorFlow {
                // PyTorch: a NaN total makes every gradient NaN; TF: any
                // non-finite total does.
                assert!(got.iter().all(|x| x.is_nan()), "{what}: all NaN");
            }
            let report = pollster::block_on(set.set().read_report()).unwrap();
            assert_same_everywhere(ctx, &what, &step_words(&step, &report));
        }
    }
}

fn refuse_everywhere(ctx: &Ctx) {
    let plan = &plans(ctx.size)[0];
    let mut data = concatenation();
    data[plan.elements(ctx.size - 1).start as usize] = f32::NAN;
    let (set, buffer, mine) = sharded(ctx, plan, &data);
    let clip = ClipNorm::new(1.0).error_if_nonfinite(true);
    let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
    match step {
        Err(Error::Clip(gradclip::Error::NonFinite { total_norm })) => {
            assert!(total_norm.is_nan(), "rank {}: {total_norm}", ctx.rank)
        }
        other => panic!("rank {}: expected NonFinite, got {other:?}", ctx.rank),
    }
    assert_eq!(
        bytemuck::cast_slice::<f32, u32>(&got),
        bytemuck::cast_slice::<f32, u32>(&mine),
        "rank {}: refused, so untouched",
        ctx.rank
    );
    // The next step, finite, goes through.
    let clean = concatenation();
    let mine = own(plan, ctx.rank, &clean).to_vec();
    let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
    step.unwrap();
    assert_close(
        "after a refusal",
        &got,
        own64(plan, ctx.rank, &reference(&clean, &clip)),
    );
}

fn failing_rank(ctx: &Ctx) {
    let data = concatenation();
    let plan = &plans(ctx.size)[0];
    let (set, buffer, mine) = sharded(ctx, plan, &data);
    let good = ClipNorm::new(1.0);
    let culprit = 1;
    let untouched = |got: &[f32], what: &str| {
        assert_eq!(
            bytemuck::cast_slice::<f32, u32>(got),
            bytemuck::cast_slice::<f32, u32>(&mine),
            "rank {}: {what}: gradients must be untouched",
            ctx.rank
        )
    };

    // Rank 1 asks for a norm the core rejects: its own error there, the
    // others learn that rank 1 failed.
    let clip = if ctx.rank == culprit {
        good.norm(Norm::P(Norm::MIN_P / 2.0))
    } else {
        good
    };
    let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
    match (ctx.rank == culprit, step) {
        (true, Err(Error::Clip(gradclip::Error::InvalidNormOrder(_)))) => {}
        (false, Err(Error::PeerFailed { rank: 1, count: 1 })) => {}
        (_, other) => panic!("rank {}: invalid norm on rank 1: {other:?}", ctx.rank),
    }
    untouched(&got, "a rank failed");

    // Rank 0 begins a step and drops it.
    ctx.queue
        .write_buffer(&buffer, 0, bytemuck::cast_slice(&mine));
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let pending = set.begin(&mut encoder, &good);
    let step = if ctx.rank == 0 {
        drop(pending);
        None
    } else {
        Some(pending.finish(&mut encoder))
    };
    ctx.queue.submit([encoder.finish()]);
    match step {
        None => {}
        Some(Err(Error::PeerFailed { rank: 0, count: 1 })) => {}
        Some(other) => panic!("rank {}: rank 0 dropped its step: {other:?}", ctx.rank),
    }
    untouched(&read(ctx, &buffer, mine.len()), "a step was dropped");

    // The ranks disagree on the clip.
    let clip = ClipNorm::new(1.0 + ctx.rank as f32);
    let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
    assert!(
        matches!(step, Err(Error::ConfigMismatch)),
        "rank {}: {step:?}",
        ctx.rank
    );
    untouched(&got, "the clips differ");

    // And then a good step on every rank works.
    let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &good);
    step.unwrap();
    assert_close(
        "after failures",
        &got,
        own64(plan, ctx.rank, &reference(&data, &good)),
    );
}

fn loss_scaling(ctx: &Ctx) {
    let plan = &plans(ctx.size)[0];
    let scale = 1024.0f32;
    let scaler = LossScaler::new().init_scale(scale).growth_interval(2);
    let clean: Vec<f32> = concatenation().iter().map(|x| x * scale).collect();
    let (set, buffer, _) = sharded(ctx, plan, &clean);
    set.set().set_loss_scaler(&scaler).unwrap();
    let whole_buffer = storage(ctx, &clean);
    let whole_set = ctx.clipper.bind(&whole_buffer, &global()).unwrap();
    whole_set.set_loss_scaler(&scaler).unwrap();
    let clip = ClipNorm::new(1.0).unscale(true);
    // finite, finite (the scale grows), inf on the last rank (it backs off), finite.
    for (i, inf) in [false, false, true, false].into_iter().enumerate() {
        let mut data = clean.clone();
        if inf {
            data[plan.elements(ctx.size - 1).start as usize] = f32::INFINITY;
        }
        let what = format!("loss-scaled step {i}, rank {}", ctx.rank);
        let mine = own(plan, ctx.rank, &data).to_vec();
        let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
        let step = step.unwrap_or_else(|e| panic!("{what}: {e}"));
        let (whole, whole_report) = single_on(ctx, &whole_set, &whole_buffer, &data, &clip);
        let report = pollster::block_on(set.set().read_report()).unwrap();
        assert_eq!(report.found_inf, inf, "{what}: found_inf");
        assert_eq!(step.nonfinite, inf, "{what}: nonfinite");
        assert_eq!(
            (
                report.found_inf,
                report.unscaled_by,
                report.loss_scale,
                report.growth_tracker
            ),
            (
                whole_report.found_inf,
                whole_report.unscaled_by,
                whole_report.loss_scale,
                whole_report.growth_tracker
            ),
            "{what}: the scaler as one process"
        );
        assert_close(
            &format!("{what} vs one process"),
            &got,
            own(plan, ctx.rank, &whole).iter().map(|&x| x as f64),
        );
        if !inf {
            let unscaled: Vec<f32> = data.iter().map(|x| x / report.unscaled_by).collect();
            assert_close(
                &format!("{what} vs float64"),
                &got,
                own64(plan, ctx.rank, &reference(&unscaled, &ClipNorm::new(1.0))),
            );
            let norm = step.total_norm;
            let want = whole_report.total_norm as f64;
            assert!(
                (norm - want).abs() <= TOL * want,
                "{what}: {norm} vs {want}"
            );
        }
        assert_same_everywhere(ctx, &what, &step_words(&step, &report));
    }
}

fn per_tensor(ctx: &Ctx) {
    let data = concatenation();
    // Norms of tensors split across ranks, gathered from their pieces.
    for plan in plans(ctx.size) {
        let (set, buffer, mine) = sharded(ctx, &plan, &data);
        let clip = ClipNorm::new(1.0).norm(Norm::P(3.0)).tensor_norms(true);
        let (step, _) = sharded_step(ctx, &set, &buffer, &mine, &clip);
        let step = step.unwrap();
        let (_, whole) = single(ctx, &data, &clip);
        assert_close(
            "per-tensor norms",
            &step.tensor_norms,
            whole.tensor_norms.iter().map(|&x| x as f64),
        );
        let clip = ClipNorm::new(1.0).per_tensor(true);
        let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
        if set.splits_tensors() {
            assert!(
                matches!(step, Err(Error::PerTensorAcrossRanks(_))),
                "rank {}: {step:?}",
                ctx.rank
            );
            assert_eq!(got, mine, "refused, so untouched");
        }
    }
    // Tensors whole on their ranks (one rank empty with 4): clipped per
    // tensor as one process does.
    let n = global().total_elements();
    let bounds = match ctx.size {
        2 => vec![0, 1037, n],
        _ => vec![0, 1037, 1037, 6040, n],
    };
    let plan = ShardPlan::from_bounds(&global(), bounds).unwrap();
    let (set, buffer, mine) = sharded(ctx, &plan, &data);
    assert!(!set.splits_tensors());
    let clip = ClipNorm::new(1.0).per_tensor(true);
    let (step, got) = sharded_step(ctx, &set, &buffer, &mine, &clip);
    step.unwrap();
    let (whole, _) = single(ctx, &data, &clip);
    assert_close(
        "per-tensor clip",
        &got,
        own(&plan, ctx.rank, &whole).iter().map(|&x| x as f64),
    );
}

fn replicated(ctx: &Ctx) {
    let data = concatenation();
    let buffer = storage(ctx, &data);
    let set = ctx.clipper.bind(&buffer, &global()).unwrap();
    let set = ReplicatedSet::new(&ctx.world, set).unwrap();
    for clip in [
        ClipNorm::new(1.0),
        ClipNorm::tensorflow(1.0).norm(Norm::P(3.0)),
    ] {
        ctx.queue
            .write_buffer(&buffer, 0, bytemuck::cast_slice(&data));
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &clip).unwrap();
        ctx.queue.submit([encoder.finish()]);
        set.check_agreement().unwrap();
        assert_close(
            "replicated",
            &read(ctx, &buffer, data.len()),
            reference(&data, &clip),
        );
    }
    // Gradients that were not all-reduced: the check says so on every rank.
    let mut skewed = data.clone();
    if ctx.rank == 1 {
        skewed[0] *= 2.0;
    }
    ctx.queue
        .write_buffer(&buffer, 0, bytemuck::cast_slice(&skewed));
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(1.0)).unwrap();
    ctx.queue.submit([encoder.finish()]);
    match set.check_agreement() {
        Err(Error::Diverged { rank: 1, .. }) => {}
        other => panic!("rank {}: skewed replicas: {other:?}", ctx.rank),
    }
}

/// bf16 of `x`, truncated (the test data only needs to be bf16 values).
fn bf16_bits(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

/// `values` (one per element of `layout`) as bf16 packed the way
/// `bind_as` reads them (each tensor from an even element), padded to whole
/// 4-byte words.
fn pack_bf16(layout: &GradLayout, values: &[f32]) -> Vec<u16> {
    let packed = layout.packed_elements(GradType::Bf16) as usize;
    let mut out = vec![0u16; packed.next_multiple_of(2).max(2)];
    for t in 0..layout.len() {
        let dst = layout.packed_range(t, GradType::Bf16).start as usize;
        for (k, i) in layout.range(t).enumerate() {
            out[dst + k] = bf16_bits(values[i as usize]);
        }
    }
    out
}

fn unpack_bf16(layout: &GradLayout, words: &[u16]) -> Vec<f32> {
    (0..layout.len())
        .flat_map(|t| {
            let dst = layout.packed_range(t, GradType::Bf16);
            words[dst.start as usize..dst.end as usize]
                .iter()
                .map(|&b| f32::from_bits((b as u32) << 16))
        })
        .collect()
}

fn bf16_buffer(ctx: &Ctx, words: &[u16]) -> wgpu::Buffer {
    let buffer = storage(ctx, &vec![0f32; words.len() / 2]);
    ctx.queue
        .write_buffer(&buffer, 0, bytemuck::cast_slice(words));
    buffer
}

fn read_bf16(ctx: &Ctx, layout: &GradLayout, buffer: &wgpu::Buffer, words: usize) -> Vec<f32> {
    let read = read_words(ctx, buffer, words / 2);
    unpack_bf16(layout, bytemuck::cast_slice(&read))
}

/// GradScaler's setting: bf16 gradients of a scaled loss, shards cut at odd
/// elements (so pieces start mid-word in the one-process packing), an inf
/// on one rank in the third step.
fn bf16_loss_scaling(ctx: &Ctx) {
    let scale = 1024.0f32;
    let scaler = LossScaler::new().init_scale(scale).growth_interval(2);
    let clip = ClipNorm::new(1.0).unscale(true);
    let clean: Vec<f32> = concatenation().iter().map(|x| x * scale).collect();
    for (p, plan) in plans(ctx.size).iter().enumerate() {
        let shard = plan.shard(ctx.rank).unwrap();
        let local = shard.layout();
        let own_range = plan.elements(ctx.rank);
        let packed = pack_bf16(local, own(plan, ctx.rank, &clean));
        let buffer = bf16_buffer(ctx, &packed);
        let set = ctx.clipper.bind_as(&buffer, local, GradType::Bf16).unwrap();
        let set = ShardedSet::new(&ctx.world, &ctx.device, &ctx.queue, set, &shard).unwrap();
        set.set().set_loss_scaler(&scaler).unwrap();
        let whole_packed = pack_bf16(&global(), &clean);
        let whole_buffer = bf16_buffer(ctx, &whole_packed);
        let whole_set = ctx
            .clipper
            .bind_as(&whole_buffer, &global(), GradType::Bf16)
            .unwrap();
        whole_set.set_loss_scaler(&scaler).unwrap();
        for (i, inf) in [false, false, true, false].into_iter().enumerate() {
            let what = format!("bf16 plan {p} step {i}, rank {}", ctx.rank);
            let mut data = clean.clone();
            if inf {
                // The last element, on the last rank that holds any.
                data[clean.len() - 1] = f32::INFINITY;
            }
            let mine = pack_bf16(local, own(plan, ctx.rank, &data));
            ctx.queue
                .write_buffer(&buffer, 0, bytemuck::cast_slice(&mine));
            let mut encoder = ctx.device.create_command_encoder(&Default::default());
            let step = set.clip_norm(&mut encoder, &clip);
            ctx.queue.submit([encoder.finish()]);
            let step = step.unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = read_bf16(ctx, local, &buffer, mine.len());

            let whole = pack_bf16(&global(), &data);
            ctx.queue
                .write_buffer(&whole_buffer, 0, bytemuck::cast_slice(&whole));
            let mut encoder = ctx.device.create_command_encoder(&Default::default());
            whole_set.clip_norm(&mut encoder, &clip).unwrap();
            ctx.queue.submit([encoder.finish()]);
            let whole_report = pollster::block_on(whole_set.read_report()).unwrap();
            let whole = read_bf16(ctx, &global(), &whole_buffer, whole.len());

            let report = pollster::block_on(set.set().read_report()).unwrap();
            assert_eq!(
                (
                    report.found_inf,
                    report.unscaled_by,
                    report.loss_scale,
                    report.growth_tracker
                ),
                (
                    whole_report.found_inf,
                    whole_report.unscaled_by,
                    whole_report.loss_scale,
                    whole_report.growth_tracker
                ),
                "{what}: the scaler as one process"
            );
            assert_eq!(report.found_inf, inf, "{what}: found_inf");
            // The clipped values are stored as bf16: a last-bit difference
            // of the coefficient may round to the neighbouring bf16.
            let ulp = 2f64.powi(-7);
            let want = &whole[own_range.start as usize..own_range.end as usize];
            for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
                let (g, w) = (g as f64, w as f64);
                assert!(
                    g == w || (g - w).abs() <= ulp * w.abs(),
                    "{what}: element {k} is {g}, one process {w}"
                );
            }
            if !inf {
                let want = whole_report.total_norm as f64;
                let norm = step.total_norm;
                assert!(
                    (norm - want).abs() <= TOL * want,
                    "{what}: {norm} vs {want}"
                );
            }
            assert_same_everywhere(ctx, &what, &step_words(&step, &report));
        }
    }
}
