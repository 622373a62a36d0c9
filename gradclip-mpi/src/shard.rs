//! Which part of the model's gradients each rank holds: pieces of global
//! tensors, cut evenly or at given bounds of the flat concatenation
//! (FSDP/ZeRO) or listed by hand (pipeline stages, tensor parallelism).

use core::ops::Range;

use gradclip::GradLayout;

use crate::error::{Error, Result};

/// A contiguous range of the elements of one global tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index of the tensor in the global layout.
    pub tensor: usize,
    /// Elements of that tensor, counted from its start.
    pub range: Range<u64>,
}

/// One rank's share of the gradients: the pieces it holds, in the order of
/// its local gradient buffer, and the [`GradLayout`] to bind that buffer with
/// (one local tensor per piece). A rank that holds nothing gets one empty
/// piece, so that it can still bind a set and take part in every step.
#[derive(Clone, Debug)]
pub struct Shard {
    global_sizes: Vec<u64>,
    pieces: Vec<Piece>,
    layout: GradLayout,
}

impl Shard {
    /// A shard made of `pieces` of the tensors of `global`, in local buffer
    /// order. Pieces outside their tensor are an error; pieces of different
    /// ranks that overlap or leave gaps are found by
    /// [`ShardedSet::new`](crate::ShardedSet::new), which sees them all.
    ///
    /// ```
    /// use gradclip::GradLayout;
    /// use gradclip_mpi::{Piece, Shard};
    /// // Tensor parallelism: this rank holds the second half of both weights.
    /// let global = GradLayout::from_sizes(&[1024, 4096])?;
    /// let shard = Shard::from_pieces(&global, vec![
    ///     Piece { tensor: 0, range: 512..1024 },
    ///     Piece { tensor: 1, range: 2048..4096 },
    /// ])?;
    /// assert_eq!(shard.layout().total_elements(), 2560);
    /// # Ok::<(), gradclip_mpi::Error>(())
    /// ```
    pub fn from_pieces(global: &GradLayout, mut pieces: Vec<Piece>) -> Result<Self> {
        let global_sizes: Vec<u64> = global.sizes().collect();
        for (i, piece) in pieces.iter().enumerate() {
            let fits = global_sizes.get(piece.tensor).is_some_and(|&size| {
                piece.range.start <= piece.range.end && piece.range.end <= size
            });
            if !fits {
                return Err(Error::PieceOutOfRange {
                    piece: i,
                    tensor: piece.tensor,
                    start: piece.range.start,
                    end: piece.range.end,
                });
            }
        }
        if pieces.is_empty() {
            pieces.push(Piece {
                tensor: 0,
                range: 0..0,
            });
        }
        let named: Vec<(String, usize)> = pieces
            .iter()
            .map(|p| {
                let name = match global.name(p.tensor) {
                    Some(name) if !name.is_empty() => name.to_string(),
                    _ => format!("tensor {}", p.tensor),
                };
                (
                    format!("{name}[{}..{}]", p.range.start, p.range.end),
                    (p.range.end - p.range.start) as usize,
                )
            })
            .collect();
        let borrowed: Vec<(&str, usize)> = named.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let layout = GradLayout::from_named(&borrowed)?;
        Ok(Self {
            global_sizes,
            pieces,
            layout,
        })
    }

    /// The layout to bind this rank's gradient buffer with.
    pub fn layout(&self) -> &GradLayout {
        &self.layout
    }

    /// The pieces, in local buffer order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Element counts of the global layout's tensors.
    pub fn global_sizes(&self) -> &[u64] {
        &self.global_sizes
    }
}

/// A flat sharding of the concatenated gradients: rank `r` holds elements
/// `bounds[r]..bounds[r + 1]` of the concatenation of the global tensors, as
/// FSDP and ZeRO shard a flattened parameter. Tensors that straddle a bound
/// are split between ranks.
#[derive(Clone, Debug)]
pub struct ShardPlan {
    global: GradLayout,
    bounds: Vec<u64>,
}

impl ShardPlan {
    /// `ranks` shards of `ceil(N / ranks)` elements each, the last ones
    /// shorter or empty (`torch.chunk`'s rule, which FSDP uses).
    ///
    /// ```
    /// let global = gradclip::GradLayout::from_sizes(&[3, 4])?;
    /// let plan = gradclip_mpi::ShardPlan::even(&global, 3)?;
    /// assert_eq!((plan.elements(0), plan.elements(1), plan.elements(2)), (0..3, 3..6, 6..7));
    /// # Ok::<(), gradclip_mpi::Error>(())
    /// ```
    pub fn even(global: &GradLayout, ranks: usize) -> Result<Self> {
        let total = global.total_elements();
        if ranks == 0 {
            return Err(Error::InvalidBounds {
                bounds: vec![],
                total,
            });
        }
        let chunk = total.div_ceil(ranks as u64);
        let bounds = (0..=ranks as u64).map(|r| (r * chunk).min(total)).collect();
        Self::from_bounds(global, bounds)
    }

    /// Rank `r` holds `bounds[r]..bounds[r + 1]`; `bounds` starts at 0, ends
    /// at the element count and never decreases (equal bounds: an empty shard).
    pub fn from_bounds(global: &GradLayout, bounds: Vec<u64>) -> Result<Self> {
        let total = global.total_elements();
        let valid = bounds.len() >= 2
            && bounds[0] == 0
            && bounds[bounds.len() - 1] == total
            && bounds.windows(2).all(|w| w[0] <= w[1]);
        if !valid {
            return Err(Error::InvalidBounds { bounds, total });
        }
        Ok(Self {
            global: global.clone(),
            bounds,
        })
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Elements of the concatenation that `rank` holds.
    pub fn elements(&self, rank: usize) -> Range<u64> {
        self.bounds[rank]..self.bounds[rank + 1]
    }

    /// The global layout the plan cuts.
    pub fn global(&self) -> &GradLayout {
        &self.global
    }

    /// What `rank` holds, as pieces of the global tensors.
    pub fn shard(&self, rank: usize) -> Result<Shard> {
        if rank >= self.ranks() {
            return Err(Error::NoSuchRank {
                rank,
                ranks: self.ranks(),
            });
        }
        let own = self.elements(rank);
        let pieces = (0..self.global.len())
            .filter_map(|t| {
                let tensor = self.global.range(t);
                let start = tensor.start.max(own.start);
                let end = tensor.end.min(own.end);
                // Zero-sized tensors inside the range are kept: the local
                // layout then has every tensor the rank's range touches.
                let inside = start < end || (tensor.is_empty() && own.contains(&tensor.start));
                inside.then(|| Piece {
                    tensor: t,
                    range: start - tensor.start..end - tensor.start,
                })
            })
            .collect();
        Shard::from_pieces(&self.global, pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_plan_splits_tensors_and_leaves_trailing_ranks_empty() {
        let global = GradLayout::from_sizes(&[5, 0, 3]).unwrap();
        let plan = ShardPlan::even(&global, 4).unwrap();
        assert_eq!(plan.bounds, [0, 2, 4, 6, 8]);
        let plan = ShardPlan::from_bounds(&global, vec![0, 0, 7, 8]).unwrap();
        let pieces: Vec<Vec<Piece>> = (0..3).map(|r| plan.shard(r).unwrap().pieces).collect();
        assert_eq!(
            pieces[0],
            [Piece {
                tensor: 0,
                range: 0..0
            }]
        );
        assert_eq!(
            pieces[1],
            [
                Piece {
                    tensor: 0,
                    range: 0..5
                },
                Piece {
                    tensor: 1,
                    range: 0..0
                },
                Piece {
                    tensor: 2,
                    range: 0..2
                },
            ]
        );
        assert_eq!(
            pieces[2],
            [Piece {
                tensor: 2,
                range: 2..3
            }]
        );
        let local: Vec<u64> = plan.shard(1).unwrap().layout().sizes().collect();
        assert_eq!(local, [5, 0, 2]);
    }

    #[test]
    fn bad_plans_are_typed_errors() {
        let global = GradLayout::from_sizes(&[5]).unwrap();
        for bounds in [vec![0], vec![1, 5], vec![0, 4], vec![0, 3, 2, 5]] {
            assert!(matches!(
                ShardPlan::from_bounds(&global, bounds),
                Err(Error::InvalidBounds { .. })
            ));
        }
        assert!(ShardPlan::even(&global, 0).is_err());
        let plan = ShardPlan::even(&global, 2).unwrap();
        assert_eq!(
            plan.shard(2).unwrap_err(),
            Error::NoSuchRank { rank: 2, ranks: 2 }
        );
        let outside = Shard::from_pieces(
            &global,
            vec![Piece {
                tensor: 0,
                range: 3..6,
            }],
        );
        assert!(matches!(
            outside,
            Err(Error::PieceOutOfRange { piece: 0, .. })
        ));
        let unknown = Shard::from_pieces(
            &global,
            vec![Piece {
                tensor: 1,
                range: 0..1,
            }],
        );
        assert!(matches!(
            unknown,
            Err(Error::PieceOutOfRange { tensor: 1, .. })
        ));
    }
}
