//! What one distributed step costs the host: the wait for the 16-byte
//! partial, and the exchange of the ranks' 32-byte records.
//!
//! ```text
//! cargo build --release -p gradclip-mpi --example exchange_cost
//! mpirun --oversubscribe -np 4 target/release/examples/exchange_cost
//! ```
//!
//! For each exchange ([`Exchange::AllGather`], [`Exchange::AllReduce`]) and
//! two gradient sizes (one element per rank, where the wait is the bare
//! submit-copy-map round trip, and `--elements` in all), it runs `--steps`
//! steps of [`ShardedSet::clip_norm`] and prints, for the slowest rank, the
//! median and 90th percentile of [`StepTimings`]: `readback` (the host
//! blocked on the partial: the GPU finishing the norm, then the 80-byte map)
//! and `exchange` (inside MPI, waiting for the slowest rank included). The
//! bare collectives (`MPI_Allgather` of 32 bytes per rank, `MPI_Allreduce`
//! of 32 bytes), timed after a barrier, show the transport alone.

use std::time::{Duration, Instant};

use clap::Parser;
use gradclip::{ClipNorm, Clipper, GradLayout};
use gradclip_mpi::{Exchange, ShardPlan, ShardedSet, StepTimings};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

#[derive(Parser, Debug)]
#[command(about = "Per-step host cost of gradclip-mpi's exchange")]
struct Args {
    /// Gradient elements in all (f32), cut evenly over the ranks.
    #[arg(long, default_value_t = 1 << 20)]
    elements: usize,
    /// Measured steps per configuration.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Unmeasured steps first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
}

/// Median and 90th percentile, in microseconds.
fn quantiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort_unstable();
    let at =
        |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.9))
}

/// The largest of every rank's `values` (collective).
fn slowest(world: &SimpleCommunicator, values: &[f64]) -> Vec<f64> {
    let mut all = vec![0f64; values.len() * world.size() as usize];
    world.all_gather_into(values, &mut all[..]);
    (0..values.len())
        .map(|i| {
            all.iter()
                .skip(i)
                .step_by(values.len())
                .fold(0f64, |m, &v| m.max(v))
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let universe = mpi::initialize().ok_or("MPI is already initialised")?;
    let world = universe.world();
    let (rank, ranks) = (world.rank() as usize, world.size() as usize);
    let (device, queue, info) = pollster::block_on(gradclip::default_device())?;
    let clipper = Clipper::new(&device, &queue)?;
    if rank == 0 {
        println!(
            "{ranks} ranks, adapter {} ({:?}), {} measured steps each; \
             microseconds, slowest rank's median / p90",
            info.name, info.backend, args.steps
        );
        println!(
            "{:<10} {:>10} {:>20} {:>20}",
            "exchange", "elements", "readback", "exchange"
        );
    }

    for elements in [ranks, args.elements.max(ranks)] {
        let global = GradLayout::from_sizes(&[elements])?;
        let plan = ShardPlan::even(&global, ranks)?;
        let shard = plan.shard(rank)?;
        let own = plan.elements(rank);
        let len = (own.end - own.start) as usize;
        let values: Vec<f32> = (0..len).map(|i| ((i % 17) as f32 - 8.0) * 1e-3).collect();
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("exchange_cost gradients"),
            size: (4 * len).max(4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&values));
        for exchange in [Exchange::AllGather, Exchange::AllReduce] {
            let set = clipper.bind(&buffer, shard.layout())?;
            let sharded =
                ShardedSet::new(&world, &device, &queue, set, &shard)?.with_exchange(exchange);
            // A clip that never scales: every step sees the same gradients.
            let clip = ClipNorm::new(f32::MAX);
            let mut timings: Vec<StepTimings> = Vec::with_capacity(args.steps);
            for i in 0..args.warmup + args.steps {
                let mut encoder = device.create_command_encoder(&Default::default());
                let step = sharded.clip_norm(&mut encoder, &clip)?;
                queue.submit([encoder.finish()]);
                if i >= args.warmup {
                    timings.push(step.timings);
                }
            }
            let (r50, r90) = quantiles(timings.iter().map(|t| t.readback).collect());
            let (x50, x90) = quantiles(timings.iter().map(|t| t.exchange).collect());
            let worst = slowest(&world, &[r50, r90, x50, x90]);
            if rank == 0 {
                println!(
                    "{:<10} {elements:>10} {:>9.1} / {:>8.1} {:>9.1} / {:>8.1}",
                    format!("{exchange:?}"),
                    worst[0],
                    worst[1],
                    worst[2],
                    worst[3]
                );
            }
        }
    }

    // The transport alone: the same bytes, no GPU, ranks lined up by a barrier.
    let record = [rank as u32; 8];
    let mut gathered = vec![0u32; 8 * ranks];
    let mut reduced = [0u32; 8];
    let (mut gather, mut reduce) = (Vec::new(), Vec::new());
    for i in 0..args.warmup + args.steps {
        world.barrier();
        let started = Instant::now();
        world.all_gather_into(&record[..], &mut gathered[..]);
        let g = started.elapsed();
        world.barrier();
        let started = Instant::now();
        world.all_reduce_into(&record[..], &mut reduced[..], SystemOperation::max());
        let r = started.elapsed();
        if i >= args.warmup {
            gather.push(g);
            reduce.push(r);
        }
    }
    let (g50, g90) = quantiles(gather);
    let (a50, a90) = quantiles(reduce);
    let worst = slowest(&world, &[g50, g90, a50, a90]);
    if rank == 0 {
        println!(
            "bare MPI_Allgather of 32 B/rank: {:.1} / {:.1}; bare MPI_Allreduce of 32 B: {:.1} / {:.1}",
            worst[0], worst[1], worst[2], worst[3]
        );
    }
    Ok(())
}
