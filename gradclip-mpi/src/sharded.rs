//! `ShardedSet`: one rank's shard of the gradients, clipped by the global
//! norm of all ranks' shards with one exchange per step.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use gradclip::{ClipNorm, GradSet, NormPartial};
use mpi::collective::UnsafeUserOperation;
use mpi::datatype::{MutView, PartitionMut, UserDatatype, View};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Equivalence};
use mpi::Count;

use crate::error::{Error, Result};
use crate::gpu_step::{self, Local, LocalRead};
use crate::piece_norms::combine_piece_norms;
use crate::shard::Shard;
use crate::wire::{self, combine_gathered, Outcome, Wire, WIRE_WORDS};

/// How the ranks' records are combined. Both give every rank the same
/// combined partial; [`AllGather`](Exchange::AllGather) by construction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Exchange {
    /// `MPI_Allgather` of the 32-byte records, then every rank combines all
    /// of them in rank order in one `NormPartial::combine` (a single
    /// rounding): bit-identical on every rank by construction, and the same
    /// bits one process gets combining the same partials. Moves
    /// 32 bytes × ranks to every rank.
    #[default]
    AllGather,
    /// `MPI_Allreduce` with a user-defined commutative operation over the
    /// 32-byte record: 32 bytes per message whatever the rank count, but one
    /// f32 rounding per level of MPI's reduction tree, and bitwise agreement
    /// across ranks rests on the MPI library combining the same operands on
    /// every rank (Open MPI's algorithms do; the MPI standard does not
    /// promise it).
    AllReduce,
}

/// Where the host time of one step went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimings {
    /// Blocked waiting for the local partial: the GPU finishing the work
    /// submitted with the norm, then the 16-byte map (the one host sync).
    pub readback: Duration,
    /// In MPI: the exchange of the records (and of the pieces' norms, when
    /// asked), including waiting for the slowest rank to arrive.
    pub exchange: Duration,
}

/// What a distributed step found, the same on every rank (but `local` and
/// `timings`).
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Steps this set has taken (failed ones included), counting from 1.
    pub step: u64,
    /// All ranks' partials combined: what the clip was recorded with.
    pub combined: NormPartial,
    /// This rank's own partial (of the stored values).
    pub local: NormPartial,
    /// The global norm, in float64 from the combined partial (of the
    /// unscaled gradients when the clip unscales). The GPU computes the
    /// coefficient from the same partial; read it with
    /// `set().read_report()` or bind `set().coefficient_binding()`.
    pub total_norm: f64,
    /// Some element on some rank was NaN or infinite (`found_inf` of an
    /// unscaling clip).
    pub nonfinite: bool,
    /// The loss scale the clip divided by, when it unscales.
    pub loss_scale: Option<f32>,
    /// The norm of every global tensor, in global layout order, when the
    /// clip asks for per-tensor norms; empty otherwise.
    pub tensor_norms: Vec<f32>,
    /// Where this rank's host time went.
    pub timings: StepTimings,
}

/// One rank's shard of the gradients, bound once, clipped every step by the
/// global norm of every rank's shard. Every rank of the communicator creates
/// one (a collective call) and calls [`clip_norm`](Self::clip_norm) (or
/// [`begin`](Self::begin) and [`PendingStep::finish`]) once per step, in the
/// same order as the others.
///
/// A step records the local norm into the caller's encoder, submits it,
/// reads back the 16-byte partial, exchanges it (one collective), and
/// records the clip with the combined partial into a fresh encoder left in
/// the caller's place. Every rank ends with the same combined partial, so
/// the same norm, coefficient, `found_inf` and next loss scale.
pub struct ShardedSet {
    comm: SimpleCommunicator,
    rank: i32,
    set: GradSet,
    device: wgpu::Device,
    queue: wgpu::Queue,
    exchange: Exchange,
    wire_type: UserDatatype,
    op: UnsafeUserOperation,
    /// Global tensor of every rank's every piece, in rank order.
    piece_tensors: Vec<usize>,
    /// Pieces per rank and where each rank's start, for the pieces' norms.
    piece_counts: Vec<Count>,
    piece_displs: Vec<Count>,
    global_tensors: usize,
    /// Some tensor has pieces on more than one rank (or several on one).
    any_split: bool,
    steps: Cell<u64>,
    /// Where the all-gather lands: every rank's record, made once.
    gathered: RefCell<Vec<u32>>,
}

impl std::fmt::Debug for ShardedSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedSet")
            .field("rank", &self.rank)
            .field("ranks", &self.comm.size())
            .field("exchange", &self.exchange)
            .field("set", &self.set)
            .field("global_tensors", &self.global_tensors)
            .field("pieces", &self.piece_tensors.len())
            .field("splits_tensors", &self.any_split)
            .field("steps", &self.steps.get())
            .finish_non_exhaustive()
    }
}

pub(crate) fn hash_sizes(sizes: &[u64]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in sizes.iter().flat_map(|s| s.to_le_bytes()) {
        hash = (hash ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^ sizes.len() as u64
}

impl ShardedSet {
    /// Makes this rank's part of a sharded set: `set` binds this rank's
    /// gradients with `shard.layout()`. Collective over `comm` (which it
    /// duplicates, so its messages never meet the caller's): the ranks
    /// exchange their pieces once and check that together they cover every
    /// global tensor exactly once; every rank returns the same error if not.
    pub fn new(
        comm: &impl Communicator,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        set: GradSet,
        shard: &Shard,
    ) -> Result<Self> {
        let comm = comm.duplicate();
        let (rank, size) = (comm.rank(), comm.size() as usize);
        let matches = set.layout().sizes().eq(shard.layout().sizes());
        let pieces = shard.pieces();
        let header = [
            matches as u64,
            hash_sizes(shard.global_sizes()),
            pieces.len() as u64,
        ];
        let mut headers = vec![0u64; 3 * size];
        comm.all_gather_into(&header[..], &mut headers[..]);
        let failed: Vec<usize> = (0..size).filter(|&r| headers[3 * r] == 0).collect();
        if let Some(&first) = failed.first() {
            return Err(if !matches {
                Error::LayoutMismatch
            } else {
                Error::PeerFailed {
                    rank: first as i32,
                    count: failed.len() as u32,
                }
            });
        }
        if (0..size).any(|r| headers[3 * r + 1] != header[1]) {
            return Err(Error::GlobalLayoutMismatch);
        }

        let piece_counts: Vec<Count> = (0..size).map(|r| headers[3 * r + 2] as Count).collect();
        let piece_displs: Vec<Count> = piece_counts
            .iter()
            .scan(0, |at, &n| {
                let here = *at;
                *at += n;
                Some(here)
            })
            .collect();
        let total_pieces: usize = piece_counts.iter().map(|&n| n as usize).sum();
        let mine: Vec<u64> = pieces
            .iter()
            .flat_map(|p| [p.tensor as u64, p.range.start, p.range.end])
            .collect();
        let mut all = vec![0u64; 3 * total_pieces];
        {
            let counts: Vec<Count> = piece_counts.iter().map(|n| 3 * n).collect();
            let displs: Vec<Count> = piece_displs.iter().map(|d| 3 * d).collect();
            let mut partition = PartitionMut::new(&mut all[..], counts, displs);
            comm.all_gather_varcount_into(&mine[..], &mut partition);
        }

        // Every rank checks the same gathered pieces: the same verdict everywhere.
        let global = shard.global_sizes();
        let mut by_tensor: Vec<Vec<(u64, u64)>> = vec![Vec::new(); global.len()];
        for piece in all.chunks_exact(3) {
            let tensor = piece[0] as usize;
            let Some(ranges) = by_tensor.get_mut(tensor) else {
                return Err(Error::Coverage { tensor });
            };
            if piece[1] < piece[2] {
                ranges.push((piece[1], piece[2]));
            }
        }
        let mut any_split = false;
        for (tensor, ranges) in by_tensor.iter_mut().enumerate() {
            ranges.sort_unstable();
            let mut covered = 0;
            for &(start, end) in ranges.iter() {
                if start != covered {
                    return Err(Error::Coverage { tensor });
                }
                covered = end;
            }
            if covered != global[tensor] {
                return Err(Error::Coverage { tensor });
            }
            any_split |= ranges.len() > 1;
        }

        Ok(Self {
            comm,
            rank,
            set,
            device: device.clone(),
            queue: queue.clone(),
            exchange: Exchange::default(),
            wire_type: UserDatatype::contiguous(WIRE_WORDS as Count, &u32::equivalent_datatype()),
            // SAFETY: `combine_op` reads and writes exactly the records the
            // all-reduce passes it, of the datatype above, and never panics.
            op: unsafe { UnsafeUserOperation::commutative(wire::combine_op) },
            piece_tensors: all.chunks_exact(3).map(|p| p[0] as usize).collect(),
            piece_counts,
            piece_displs,
            global_tensors: global.len(),
            any_split,
            steps: Cell::new(0),
            gathered: RefCell::new(vec![0u32; WIRE_WORDS * size]),
        })
    }

    /// Chooses how the records are combined (every rank must choose the
    /// same); [`Exchange::AllGather`] by default.
    pub fn with_exchange(mut self, exchange: Exchange) -> Self {
        self.exchange = exchange;
        self
    }

    /// The exchange in use.
    pub fn exchange(&self) -> Exchange {
        self.exchange
    }

    /// This rank's gradient set: for `read_report`, `coefficient_binding`
    /// (a fused optimizer), `set_loss_scaler`.
    pub fn set(&self) -> &GradSet {
        &self.set
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// Whether some global tensor has pieces on several ranks.
    pub fn splits_tensors(&self) -> bool {
        self.any_split
    }

    /// One distributed step: [`begin`](Self::begin) then
    /// [`finish`](PendingStep::finish). Collective.
    ///
    /// Submits what `encoder` holds (the norm needs the gradients it
    /// computes), with the local norm appended, and leaves in `encoder` a
    /// fresh encoder with the clip recorded: record the optimizer after it
    /// and submit as usual. On an error no gradient is touched on any rank:
    /// nothing is recorded into the fresh encoder (with `error_if_nonfinite`
    /// the clip is recorded and leaves the gradients as they are, so the
    /// loss scale and the coefficient binding are what one process would
    /// leave); if this rank's own call failed before submitting, `encoder`
    /// still holds the caller's work, unsubmitted.
    pub fn clip_norm(&self, encoder: &mut wgpu::CommandEncoder, clip: &ClipNorm) -> Result<Step> {
        self.begin(encoder, clip).finish(encoder)
    }

    /// The first half of a step: records the local norm into `encoder`,
    /// submits it, submits the copy of the 16-byte partial (of the step's
    /// report when the clip unscales or asks for per-tensor norms: that copy
    /// is submitted by `finish`), and returns without waiting, so the
    /// caller can do other host work while the GPU finishes, before
    /// [`PendingStep::finish`]. Never fails: an error is carried to
    /// `finish`, which must still be called so the other ranks learn of it
    /// (dropping the pending step tells them too).
    pub fn begin(&self, encoder: &mut wgpu::CommandEncoder, clip: &ClipNorm) -> PendingStep<'_> {
        let local = self.check(clip).and_then(|()| {
            Ok(gpu_step::submit_local(
                &self.set,
                &self.queue,
                encoder,
                || self.fresh_encoder(),
                clip,
            )?)
        });
        PendingStep {
            set: self,
            clip: *clip,
            local: Some(local),
        }
    }

    fn fresh_encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("gradclip-mpi clip"),
            })
    }

    /// What this crate (rather than the core) rejects before recording.
    fn check(&self, clip: &ClipNorm) -> Result<()> {
        if clip.is_per_tensor() {
            if self.any_split {
                return Err(Error::PerTensorAcrossRanks(
                    "a tensor is split between ranks",
                ));
            }
            if clip.unscales() {
                return Err(Error::PerTensorAcrossRanks(
                    "with unscaling (found_inf spans all ranks)",
                ));
            }
        }
        Ok(())
    }

    /// The collective: this rank's record in, the verdict of all out.
    fn exchange_records(&self, record: Wire) -> Outcome {
        let words: [u32; WIRE_WORDS] = bytemuck::cast(record);
        match self.exchange {
            Exchange::AllGather => {
                let mut all = self.gathered.borrow_mut();
                self.comm.all_gather_into(&words[..], &mut all[..]);
                let records: &[Wire] = bytemuck::cast_slice(&all);
                combine_gathered(records)
            }
            Exchange::AllReduce => {
                let mut total = [0u32; WIRE_WORDS];
                // SAFETY: each buffer is exactly one 32-byte record of u32
                // words, which is what `wire_type` describes.
                let send = unsafe { View::with_count_and_datatype(&words[..], 1, &self.wire_type) };
                let mut recv =
                    unsafe { MutView::with_count_and_datatype(&mut total[..], 1, &self.wire_type) };
                self.comm.all_reduce_into(&send, &mut recv, &self.op);
                Outcome::from(&bytemuck::cast::<_, Wire>(total))
            }
        }
    }

    /// Every global tensor's norm from every rank's pieces (a second
    /// collective, only for clips that ask for per-tensor norms).
    fn gather_tensor_norms(&self, local: &[f32], clip: &ClipNorm, scale: f64) -> Vec<f32> {
        let mut all = vec![0f32; self.piece_tensors.len()];
        {
            let mut partition =
                PartitionMut::new(&mut all[..], &self.piece_counts[..], &self.piece_displs[..]);
            self.comm.all_gather_varcount_into(local, &mut partition);
        }
        let mut pieces: Vec<Vec<f64>> = vec![Vec::new(); self.global_tensors];
        for (&tensor, &norm) in self.piece_tensors.iter().zip(&all) {
            pieces[tensor].push(norm as f64 / scale);
        }
        pieces
            .into_iter()
            .map(|p| combine_piece_norms(p, clip.norm_order()) as f32)
            .collect()
    }
}

/// A step between [`ShardedSet::begin`] and [`finish`](Self::finish): the
/// local norm is submitted and its map started. Dropping it unfinished takes
/// part in the exchange as a failed rank, so the other ranks return
/// [`Error::PeerFailed`] instead of waiting forever.
#[must_use = "every rank must finish the step, or the others wait for it"]
#[derive(Debug)]
pub struct PendingStep<'s> {
    set: &'s ShardedSet,
    clip: ClipNorm,
    /// Taken by `finish`; still here on drop when it was never called.
    local: Option<Result<LocalRead<'s>>>,
}

impl PendingStep<'_> {
    /// Waits for the local partial, exchanges it (collective), and records
    /// the clip with the combined partial into `encoder` (the fresh encoder
    /// [`ShardedSet::begin`] left there, or any other).
    pub fn finish(mut self, encoder: &mut wgpu::CommandEncoder) -> Result<Step> {
        let local = self.local.take().expect("a pending step is finished once");
        let sharded = self.set;
        let clip = self.clip;
        let step = sharded.steps.get() + 1;
        sharded.steps.set(step);

        let waited = Instant::now();
        let local: Result<Local> =
            local.and_then(|read| Ok(gpu_step::finish_local(&sharded.set, read, &clip)?));
        let readback = waited.elapsed();

        let exchanged = Instant::now();
        let record = Wire::new(sharded.rank, &clip, local.as_ref().ok().map(|l| l.partial));
        let outcome = sharded.exchange_records(record);
        let combined = match (outcome, local) {
            (Outcome::Combined(combined), Ok(local)) => (combined, local),
            (_, Err(own)) => return Err(own),
            (Outcome::Failed { rank, count }, Ok(_)) => {
                return Err(Error::PeerFailed { rank, count })
            }
            (Outcome::Mismatch, Ok(_)) => return Err(Error::ConfigMismatch),
        };
        let (combined, local) = combined;
        // A loss scale of 0 (decayed) never occurs with a checked
        // LossScaler; dividing by it would only turn the norm into inf.
        let scale = local.loss_scale.map_or(1.0, |s| s as f64);
        let tensor_norms = if clip.reports_tensor_norms() {
            sharded.gather_tensor_norms(&local.tensor_norms, &clip, scale)
        } else {
            Vec::new()
        };
        let exchange = exchanged.elapsed();

        let total_norm = combined.total_norm(clip.norm_order())? / scale;
        let nonfinite = combined.nonfinite();
        let refuse = clip.errors_if_nonfinite() && nonfinite;
        if clip.is_per_tensor() {
            // Every tensor is whole on its rank (checked in `begin`): each
            // rank clips its own, as one process would.
            if !refuse {
                sharded.set.clip_norm(encoder, &clip)?;
            }
        } else {
            // Recorded even when refusing: the GPU then leaves the gradients
            // untouched and its state (coefficient binding, loss scale) is
            // what one process would have.
            gpu_step::record_clip(&sharded.set, encoder, &clip, &combined)?;
        }
        if refuse {
            return Err(gradclip::Error::NonFinite {
                total_norm: total_norm as f32,
            }
            .into());
        }
        Ok(Step {
            step,
            combined,
            local: local.partial,
            total_norm,
            nonfinite,
            loss_scale: local.loss_scale,
            tensor_norms,
            timings: StepTimings { readback, exchange },
        })
    }
}

impl Drop for PendingStep<'_> {
    fn drop(&mut self) {
        if let Some(local) = self.local.take() {
            // Never finished: the readback is released when the copy is
            // back; tell the other ranks this one failed.
            drop(local);
            let record = Wire::new(self.set.rank, &self.clip, None);
            let _ = self.set.exchange_records(record);
        }
    }
}
