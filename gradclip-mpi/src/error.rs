//! The crate's error type.

/// Everything that can go wrong in a distributed clip. Every collective call
/// returns the same kind of error on every rank (the rank whose own call
/// failed gets its own error, the others [`PeerFailed`](Error::PeerFailed)),
/// so no rank is left waiting in a collective the others have given up on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// gradclip rejected the clip or the binding on this rank, or found a
    /// non-finite norm with `error_if_nonfinite` (the combined norm: then
    /// every rank returns it and no rank's gradients are touched).
    #[error(transparent)]
    Clip(#[from] gradclip::Error),
    /// Another rank's call failed (its error is its own); this rank recorded
    /// nothing and its gradients are untouched. `rank` is the lowest failing
    /// rank, `count` how many failed.
    #[error("{count} rank(s) failed this step (the lowest is rank {rank}); nothing was recorded")]
    PeerFailed { rank: i32, count: u32 },
    /// The ranks called the step with different clips (norm order, max norm,
    /// semantics or options): combining their partials would be wrong.
    #[error("the ranks disagree on the clip configuration; nothing was recorded")]
    ConfigMismatch,
    /// A shard piece names a tensor the global layout does not have, or
    /// reaches past its end.
    #[error(
        "shard piece {piece}: tensor {tensor} range {start}..{end} is outside the global layout"
    )]
    PieceOutOfRange {
        piece: usize,
        tensor: usize,
        start: u64,
        end: u64,
    },
    /// Shard bounds that do not start at 0, end at the element count and
    /// never decrease, or that name no rank.
    #[error("shard bounds must go from 0 to {total} without decreasing, one more than the rank count; got {bounds:?}")]
    InvalidBounds { bounds: Vec<u64>, total: u64 },
    /// `rank` is not below the plan's rank count.
    #[error("rank {rank} is outside a plan of {ranks} ranks")]
    NoSuchRank { rank: usize, ranks: usize },
    /// The ranks' pieces do not cover `tensor` exactly once (a gap, an
    /// overlap, or ranks built from different global layouts).
    #[error("the shards of the ranks do not cover global tensor {tensor} exactly once")]
    Coverage { tensor: usize },
    /// The ranks' shards were cut from different global layouts, or the
    /// communicator's size differs from the plan's.
    #[error("the ranks' shards come from different global layouts")]
    GlobalLayoutMismatch,
    /// The gradient set's layout is not the shard's local layout.
    #[error("the gradient set's layout differs from the shard's local layout")]
    LayoutMismatch,
    /// Per-tensor clipping of a tensor whose pieces live on several ranks: it
    /// needs every piece's norm before any piece is scaled, which the core's
    /// `clip_with_partial` cannot take; or per-tensor clipping with
    /// unscaling, whose skip decision spans all ranks.
    #[error("per-tensor clipping across ranks is not supported here: {0}")]
    PerTensorAcrossRanks(&'static str),
    /// A replicated set's ranks reached different results (different
    /// hardware or drivers, or gradients that were not all-reduced first).
    #[error("replicated ranks disagree on the {what}; rank {rank} differs from rank 0")]
    Diverged { what: &'static str, rank: i32 },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;
