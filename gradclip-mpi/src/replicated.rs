//! `ReplicatedSet`: data-parallel ranks, which hold the same gradients after
//! their all-reduce, clip without any exchange.

use gradclip::{ClipNorm, ClipReport, GradSet};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

use crate::error::{Error, Result};
use crate::sharded::hash_sizes;

/// Words of a report that [`ReplicatedSet::check_agreement`] compares, and
/// their names.
const WORDS: usize = 13;
const WORD_NAMES: [&str; WORDS] = [
    "step",
    "step",
    "total norm",
    "coefficient",
    "non-finite flag",
    "found_inf",
    "unscaled_by",
    "loss scale",
    "growth tracker",
    "norm partial",
    "norm partial",
    "norm partial",
    "norm partial",
];

/// The words of a report to compare; an `error_if_nonfinite` refusal is the
/// report of a NaN or infinite norm that touched nothing.
fn report_words(report: gradclip::Result<ClipReport>) -> gradclip::Result<[u32; WORDS]> {
    let r = match report {
        Ok(report) => report,
        Err(gradclip::Error::NonFinite { total_norm }) => {
            let mut words = [0u32; WORDS];
            words[2] = total_norm.to_bits();
            words[4] = u32::MAX; // no report field takes this value
            return Ok(words);
        }
        Err(other) => return Err(other),
    };
    let p: [u32; 4] = bytemuck::cast(r.partial.to_bytes());
    Ok([
        r.step as u32,
        (r.step >> 32) as u32,
        r.total_norm.to_bits(),
        r.coefficient.to_bits(),
        r.nonfinite as u32,
        r.found_inf as u32,
        r.unscaled_by.to_bits(),
        r.loss_scale.to_bits(),
        r.growth_tracker,
        p[0],
        p[1],
        p[2],
        p[3],
    ])
}

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
    pub fn new(comm: &impl Communicator, set: GradSet) -> Result<Self> {
        let comm = comm.duplicate();
        let sizes: Vec<u64> = set.layout().sizes().collect();
        let hash = hash_sizes(&sizes);
        let mut hashes = vec![0u64; comm.size() as usize];
        comm.all_gather_into(&hash, &mut hashes[..]);
        if hashes.iter().any(|&h| h != hash) {
            return Err(Error::GlobalLayoutMismatch);
        }
        Ok(Self { comm, set })
    }

    /// This rank's gradient set.
    pub fn set(&self) -> &GradSet {
        &self.set
    }

    /// gradclip's clip of this rank's (full) gradients; not collective.
    pub fn clip_norm(&self, encoder: &mut wgpu::CommandEncoder, clip: &ClipNorm) -> Result<()> {
        Ok(self.set.clip_norm(encoder, clip)?)
    }

    /// Collective: reads back the report of the latest submitted clip
    /// (`read_report`: norm, coefficient, flags, `found_inf`, loss scale,
    /// partial, step) and compares it bit for bit across ranks. Every rank
    /// returns [`Error::Diverged`] naming the first rank that differs from
    /// rank 0, or [`Error::PeerFailed`] if a rank could not read its report
    /// (that rank returns its own error).
    pub fn check_agreement(&self) -> Result<()> {
        let state = report_words(pollster::block_on(self.set.read_report()));
        let mut mine = [0u32; WORDS + 1];
        match &state {
            Ok(words) => mine[1..].copy_from_slice(words),
            Err(_) => mine[0] = 1,
        }
        let mut all = vec![0u32; (WORDS + 1) * self.comm.size() as usize];
        self.comm.all_gather_into(&mine[..], &mut all[..]);
        let ranks: Vec<&[u32]> = all.chunks_exact(WORDS + 1).collect();
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
            if let Some(word) = (1..=WORDS).find(|&w| words[w] != ranks[0][w]) {
                return Err(Error::Diverged {
                    what: WORD_NAMES[word - 1],
                    rank: rank as i32,
                });
            }
        }
        Ok(())
    }
}
