//! Global-norm gradient clipping across processes and machines: gradclip's
//! 16-byte norm partials exchanged over MPI (rsmpi), one collective per step.
//!
//! Sharded training (ZeRO/FSDP, pipeline stages, tensor parallelism) leaves
//! each rank a different part of the gradients; the global norm needs all of
//! them. A [`ShardedSet`] records this rank's norm, reads back its partial,
//! combines it with every other rank's exactly (an all-gather and
//! `NormPartial::combine`, or an all-reduce with a user-defined MPI
//! operation: [`Exchange`]), and records the clip with the combined partial,
//! so every rank reaches the same norm, coefficient, `found_inf` and loss
//! scale. Data-parallel ranks hold the same gradients after their all-reduce
//! and need no exchange: [`ReplicatedSet`].
//!
//! ```no_run
//! use gradclip::{ClipNorm, Clipper, GradLayout};
//! use gradclip_mpi::{ShardPlan, ShardedSet};
//! use mpi::traits::Communicator;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let universe = mpi::initialize().ok_or("MPI is already initialized")?;
//! let world = universe.world();
//! let (device, queue, _) = pollster::block_on(gradclip::default_device())?;
//!
//! // The model's tensors, cut evenly over the ranks (FSDP's flat sharding).
//! let global = GradLayout::from_sizes(&[784 * 128, 128, 128 * 10, 10])?;
//! let shard = ShardPlan::even(&global, world.size() as usize)?.shard(world.rank() as usize)?;
//! # let grads = device.create_buffer(&wgpu::BufferDescriptor { label: None,
//! #     size: 4 * shard.layout().total_elements().max(1), usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false });
//! // `grads` holds this rank's elements of the concatenation.
//! let set = Clipper::new(&device, &queue)?.bind(&grads, shard.layout())?;
//! let sharded = ShardedSet::new(&world, &device, &queue, set, &shard)?;
//!
//! let mut encoder = device.create_command_encoder(&Default::default());
//! // ... record the backward pass ...
//! let step = sharded.clip_norm(&mut encoder, &ClipNorm::new(1.0))?; // collective
//! // ... record the optimizer step ...
//! queue.submit([encoder.finish()]);
//! println!("global norm {}", step.total_norm);
//! # Ok(()) }
//! ```

mod error;
mod gpu_step;
mod piece_norms;
mod replicated;
mod shard;
mod sharded;
mod wire;

pub use error::{Error, Result};
pub use replicated::ReplicatedSet;
pub use shard::{Piece, Shard, ShardPlan};
pub use sharded::{Exchange, PendingStep, ShardedSet, Step, StepTimings};
