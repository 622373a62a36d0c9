//! `ReplicatedSet`: data-parallel ranks, which hold the same gradients after
//! their all-reduce, clip without any exchange.

use gradclip::{ClipNorm, GradSet};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

use crate::error::{Error, Result};
use crate::gpu_step::GpuStep;
use crate::sharded::hash_sizes;

/// Names of the words [`ReplicatedSet::check_agreement`] compares: gradclip's
/// `ClipState` (12 words), then the partial (4).
const WORD_NAMES: [&str; 16] = [
    "total norm",
    "coefficient",
    "non-finite flags",
    "scale kind",
    "scale dispatch",
    "scale dispatch",
    "scale dispatch",
    "found_inf",
    "loss scale",
    "unscaled_by",
    "growth tracker",
    "clip state padding",
    "norm partial",
    "norm partial",
    "norm partial",
    "norm partial",
];

/// A data-parallel rank's gradients, identical on every rank once the
/// gradient all-reduce is done. The global norm is then each rank's own
/// norm: [`clip_norm`](Self::clip_norm) is gradclip's plain clip, with no
/// exchange and no host sync, and gradclip's fixed reduction order gives
/// every rank the same bits, so long as the ranks run the same driver on
/// the same kind of device. [`check_agreement`](Self::check_agreement)
/// verifies that (for tests, or now and then on a mixed cluster).
pub struct ReplicatedSet {
    comm: SimpleCommunicator,
    set: GradSet,
    gpu: GpuStep,
}

impl std::fmt::Debug for ReplicatedSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedSet")
            .field("rank", &self.comm.rank())
            .field("ranks", &self.comm.size())
            .field("set", &self.set)
            .finish_non_exhaustive()
    }
}

impl ReplicatedSet {
    /// Wraps this rank's copy of the gradients. Collective over `comm`
    /// (duplicated): every rank must bind the same layout, or every rank
    /// returns [`Error::GlobalLayoutMismatch`].
    pub fn new(
        comm: &impl Communicator,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        set: GradSet,
    ) -> Result<Self> {
        let comm = comm.duplicate();
        let sizes: Vec<u64> = set.layout().sizes().collect();
        let hash = hash_sizes(&sizes);
        let mut hashes = vec![0u64; comm.size() as usize];
        comm.all_gather_into(&hash, &mut hashes[..]);
        if hashes.iter().any(|&h| h != hash) {
            return Err(Error::GlobalLayoutMismatch);
        }
        let gpu = GpuStep::new(device, queue, &set);
        Ok(Self { comm, set, gpu })
    }

    /// This rank's gradient set.
    pub fn set(&self) -> &GradSet {
        &self.set
    }

    /// gradclip's clip of this rank's (full) gradients; not collective.
    pub fn clip_norm(&self, encoder: &mut wgpu::CommandEncoder, clip: &ClipNorm) -> Result<()> {
        Ok(self.set.clip_norm(encoder, clip)?)
    }

    /// Collective: reads back what the latest submitted clip left on the
    /// GPU (norm, coefficient, flags, `found_inf`, loss scale, partial) and
    /// compares it bit for bit across ranks. Every rank returns
    /// [`Error::Diverged`] naming the first rank that differs from rank 0,
    /// or [`Error::PeerFailed`] if a rank could not read its state.
    pub fn check_agreement(&self) -> Result<()> {
        let state = self.gpu.read_state(&self.set);
        let mut mine = [0u32; 17];
        match &state {
            Ok(words) => mine[1..].copy_from_slice(words),
            Err(_) => mine[0] = 1,
        }
        let mut all = vec![0u32; 17 * self.comm.size() as usize];
        self.comm.all_gather_into(&mine[..], &mut all[..]);
        let ranks: Vec<&[u32]> = all.chunks_exact(17).collect();
        let failed: Vec<usize> = (0..ranks.len()).filter(|&r| ranks[r][0] != 0).collect();
        if let Some(&first) = failed.first() {
            return Err(match state {
                Err(own) => own.into(),
                Ok(_) => Error::PeerFailed {
                    rank: first as i32,
                    count: failed.len() as u32,
                },
            });
        }
        for (rank, words) in ranks.iter().enumerate().skip(1) {
            if let Some(word) = (1..17).find(|&w| words[w] != ranks[0][w]) {
                return Err(Error::Diverged {
                    what: WORD_NAMES[word - 1],
                    rank: rank as i32,
                });
            }
        }
        Ok(())
    }
}
