//! Sharded training of a small MLP over MPI ranks, its gradients clipped by
//! their global norm with gradclip-mpi, checked against the same training
//! in one process.
//!
//! ```text
//! cargo build --release -p gradclip-mpi --example sharded_mlp
//! mpirun --oversubscribe -np 4 target/release/examples/sharded_mlp --steps 200
//! ```
//!
//! Every rank owns a contiguous quarter of the flat parameter vector (FSDP's
//! flat sharding: tensors are split between ranks) with its gradients in a
//! GPU buffer of its own. A step: the gradients of the full batch (computed
//! on the host here, the same on every rank, to keep the example small; in
//! FSDP each rank would hold its reduce-scattered shard), this rank's shard
//! written to its buffer, [`ShardedSet::clip_norm`] (the ranks exchange 32
//! bytes and clip by the global norm), SGD on the shard, and an all-gather
//! of the parameters. Rank 0 then trains the same model from the same start
//! in one process, clipping the whole gradient with `GradSet::clip_norm`,
//! prints both losses and fails if they differ by more than `--tolerance`.

use clap::Parser;
use gradclip::{ClipNorm, Clipper, GradLayout};
use gradclip_mpi::{Exchange, ShardPlan, ShardedSet};
use mpi::datatype::PartitionMut;
use mpi::traits::{Communicator, CommunicatorCollectives};
use mpi::Count;

#[derive(Parser, Debug)]
#[command(about = "Sharded MLP training over MPI with global-norm clipping")]
struct Args {
    /// Training steps.
    #[arg(long, default_value_t = 200)]
    steps: u32,
    /// Max global L2 norm (PyTorch semantics).
    #[arg(long, default_value_t = 1.0)]
    clip: f32,
    /// SGD learning rate.
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
    /// Steps per printed row.
    #[arg(long, default_value_t = 20)]
    every: u32,
    /// Combine the ranks' partials with an all-reduce instead of an all-gather.
    #[arg(long)]
    all_reduce: bool,
    /// Largest relative difference allowed between the sharded and the
    /// single-process losses.
    #[arg(long, default_value_t = 1e-5)]
    tolerance: f64,
}

const INPUTS: usize = 16;
const HIDDEN: usize = 64;
const SAMPLES: usize = 256;

/// W1 (HIDDEN x INPUTS), b1, w2, b2, back to back.
fn layout() -> GradLayout {
    GradLayout::from_named(&[
        ("w1", HIDDEN * INPUTS),
        ("b1", HIDDEN),
        ("w2", HIDDEN),
        ("b2", 1),
    ])
    .expect("a valid layout")
}

/// A deterministic value in [-1, 1) for index `i` of stream `seed`.
fn noise(seed: u64, i: u64) -> f32 {
    let mut x = (i ^ seed.rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

struct Data {
    x: Vec<f32>,
    t: Vec<f32>,
}

fn data() -> Data {
    let x: Vec<f32> = (0..SAMPLES * INPUTS)
        .map(|i| 2.0 * noise(1, i as u64))
        .collect();
    // A target the network can fit, with a large output scale so the first
    // gradients are far above the clip.
    let t = x
        .chunks_exact(INPUTS)
        .map(|s| {
            8.0 * s
                .iter()
                .enumerate()
                .map(|(j, v)| (v * (j + 1) as f32 * 0.3).sin())
                .sum::<f32>()
        })
        .collect();
    Data { x, t }
}

fn init_params() -> Vec<f32> {
    let n = layout().total_elements() as usize;
    (0..n).map(|i| 0.5 * noise(2, i as u64)).collect()
}

/// Mean squared error and its gradient, in layout order.
fn loss_and_grads(params: &[f32], data: &Data) -> (f32, Vec<f32>) {
    let (w1, rest) = params.split_at(HIDDEN * INPUTS);
    let (b1, rest) = rest.split_at(HIDDEN);
    let (w2, b2) = rest.split_at(HIDDEN);
    let mut grads = vec![0f32; params.len()];
    let (g1, rest) = grads.split_at_mut(HIDDEN * INPUTS);
    let (gb1, rest) = rest.split_at_mut(HIDDEN);
    let (g2, gb2) = rest.split_at_mut(HIDDEN);
    let mut loss = 0f32;
    let mut h = [0f32; HIDDEN];
    for (x, &t) in data.x.chunks_exact(INPUTS).zip(&data.t) {
        for (j, hj) in h.iter_mut().enumerate() {
            let row = &w1[j * INPUTS..(j + 1) * INPUTS];
            *hj = (row.iter().zip(x).map(|(w, v)| w * v).sum::<f32>() + b1[j]).tanh();
        }
        let y = h.iter().zip(w2).map(|(a, w)| a * w).sum::<f32>() + b2[0];
        let err = y - t;
        loss += err * err;
        let dy = 2.0 * err / SAMPLES as f32;
        gb2[0] += dy;
        for j in 0..HIDDEN {
            g2[j] += dy * h[j];
            let dz = dy * w2[j] * (1.0 - h[j] * h[j]);
            gb1[j] += dz;
            for (g, v) in g1[j * INPUTS..(j + 1) * INPUTS].iter_mut().zip(x) {
                *g += dz * v;
            }
        }
    }
    (loss / SAMPLES as f32, grads)
}

/// A GPU buffer of `len` gradients and its readback, made once.
struct GradBuffer {
    grads: wgpu::Buffer,
    readback: wgpu::Buffer,
    len: usize,
}

impl GradBuffer {
    fn new(device: &wgpu::Device, len: usize) -> Self {
        let bytes = (4 * len).max(4) as u64;
        Self {
            grads: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("mlp gradients"),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("mlp clipped gradients"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            len,
        }
    }

    /// Records the copy of the clipped gradients for the host optimizer.
    fn record_copy(&self, encoder: &mut wgpu::CommandEncoder) {
        if self.len > 0 {
            encoder.copy_buffer_to_buffer(&self.grads, 0, &self.readback, 0, 4 * self.len as u64);
        }
    }

    /// Waits for the submitted copy and reads it.
    fn read(&self, device: &wgpu::Device) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        if self.len == 0 {
            return Ok(Vec::new());
        }
        let slice = self.readback.slice(..4 * self.len as u64);
        slice.map_async(wgpu::MapMode::Read, |r| {
            if let Err(e) = r {
                eprintln!("map failed: {e}");
            }
        });
        device.poll(wgpu::PollType::wait_indefinitely())?;
        let out = bytemuck::cast_slice(&slice.get_mapped_range()?[..]).to_vec();
        self.readback.unmap();
        Ok(out)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let universe = mpi::initialize().ok_or("MPI is already initialised")?;
    let world = universe.world();
    let (rank, ranks) = (world.rank() as usize, world.size() as usize);
    let (device, queue, info) = pollster::block_on(gradclip::default_device())?;
    let clipper = Clipper::new(&device, &queue)?;
    let clip = ClipNorm::new(args.clip);
    let data = data();
    let global = layout();
    if rank == 0 {
        println!(
            "{ranks} rank(s), adapter {} ({:?}); MLP {INPUTS}-{HIDDEN}-1, {} parameters, \
             {SAMPLES} samples; SGD lr {}, clip {}",
            info.name,
            info.backend,
            global.total_elements(),
            args.lr,
            args.clip
        );
    }

    // Sharded: this rank's part of the flat parameters and gradients.
    let plan = ShardPlan::even(&global, ranks)?;
    let shard = plan.shard(rank)?;
    let own = plan.elements(rank);
    let own = own.start as usize..own.end as usize;
    let buffer = GradBuffer::new(&device, own.len());
    let set = clipper.bind(&buffer.grads, shard.layout())?;
    let exchange = if args.all_reduce {
        Exchange::AllReduce
    } else {
        Exchange::AllGather
    };
    let sharded = ShardedSet::new(&world, &device, &queue, set, &shard)?.with_exchange(exchange);
    let counts: Vec<Count> = (0..ranks)
        .map(|r| {
            let e = plan.elements(r);
            (e.end - e.start) as Count
        })
        .collect();
    let displs: Vec<Count> = (0..ranks)
        .map(|r| plan.elements(r).start as Count)
        .collect();

    let mut params = init_params();
    let mut sharded_losses = Vec::new();
    let mut norms = Vec::new();
    for _ in 0..args.steps {
        let (loss, grads) = loss_and_grads(&params, &data);
        sharded_losses.push(loss);
        queue.write_buffer(&buffer.grads, 0, bytemuck::cast_slice(&grads[own.clone()]));
        let mut encoder = device.create_command_encoder(&Default::default());
        let step = sharded.clip_norm(&mut encoder, &clip)?;
        buffer.record_copy(&mut encoder);
        queue.submit([encoder.finish()]);
        norms.push(step.total_norm);
        let clipped = buffer.read(&device)?;
        let mine: Vec<f32> = params[own.clone()]
            .iter()
            .zip(&clipped)
            .map(|(p, g)| p - args.lr * g)
            .collect();
        let mut partition = PartitionMut::new(&mut params[..], &counts[..], &displs[..]);
        world.all_gather_varcount_into(&mine[..], &mut partition);
    }
    if rank != 0 {
        return Ok(());
    }

    // The same training in one process: the whole gradient in one set.
    let whole = GradBuffer::new(&device, global.total_elements() as usize);
    let set = clipper.bind(&whole.grads, &global)?;
    let mut params = init_params();
    let mut worst = 0f64;
    println!(
        "{:>6} {:>14} {:>14} {:>10} {:>12}",
        "step", "sharded loss", "1-process loss", "rel diff", "grad norm"
    );
    for i in 0..args.steps as usize {
        let (loss, grads) = loss_and_grads(&params, &data);
        queue.write_buffer(&whole.grads, 0, bytemuck::cast_slice(&grads));
        let mut encoder = device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &clip)?;
        whole.record_copy(&mut encoder);
        queue.submit([encoder.finish()]);
        let clipped = whole.read(&device)?;
        for (p, g) in params.iter_mut().zip(&clipped) {
            *p -= args.lr * g;
        }
        let diff =
            ((sharded_losses[i] - loss) as f64).abs() / (loss as f64).abs().max(f64::MIN_POSITIVE);
        worst = worst.max(diff);
        if i % args.every as usize == 0 || i + 1 == args.steps as usize {
            println!(
                "{i:>6} {:>14.6} {loss:>14.6} {diff:>10.2e} {:>12.4}",
                sharded_losses[i], norms[i]
            );
        }
    }
    println!(
        "largest relative loss difference over {} steps: {worst:.3e}",
        args.steps
    );
    if worst > args.tolerance {
        return Err(
            format!("the sharded run's loss differs from one process's by {worst:.3e}").into(),
        );
    }
    Ok(())
}
