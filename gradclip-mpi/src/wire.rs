//! The 32-byte record every rank contributes to a step's exchange, and the
//! two ways of combining the records: all-gather then combine locally (every
//! rank combines the same records in rank order: bit-identical results), or
//! an all-reduce with a user-defined MPI operation ([`combine_op`]).
//!
//! Besides gradclip's 16-byte partial, the record carries what makes a
//! failing or misconfigured rank fail the others instead of hanging them or
//! corrupting their norm: the norm order, a fingerprint of the clip, and
//! whether this rank failed. Every field combines associatively and
//! commutatively (sum, min, "equal or 0"), so the all-reduce needs no second
//! round; only the partial's floating-point sums round differently along
//! different reduction trees.

use core::ffi::{c_int, c_void};

use bytemuck::{Pod, Zeroable};
use gradclip::{ClipNorm, Norm, NormPartial, Semantics};

/// `first_failed` when no rank failed.
pub(crate) const NO_RANK: u32 = u32::MAX;
/// `fingerprint` once two ranks' clips differed (a real fingerprint is never 0).
pub(crate) const MISMATCH: u32 = 0;
/// u32 words of a [`Wire`].
pub(crate) const WIRE_WORDS: usize = 8;

/// One rank's contribution, or several ranks' combined.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct Wire {
    /// `NormPartial::to_bytes`, as words.
    pub partial: [u32; 4],
    /// The norm order as f32 bits (2 for L2, inf for Inf), for the MPI
    /// operation, which gets nothing but the records.
    pub p_bits: u32,
    /// [`fingerprint`] of the clip, or [`MISMATCH`].
    pub fingerprint: u32,
    /// Ranks whose call failed.
    pub failed: u32,
    /// The lowest of them, or [`NO_RANK`].
    pub first_failed: u32,
}

const _: () = assert!(size_of::<Wire>() == WIRE_WORDS * 4);

/// The order of `norm` as the single number the partial's combine needs.
pub(crate) fn norm_p(norm: Norm) -> f32 {
    match norm {
        Norm::L1 => 1.0,
        Norm::L2 => 2.0,
        Norm::Inf => f32::INFINITY,
        Norm::P(p) => p,
    }
}

/// The inverse of [`norm_p`] (up to the spelling: `P(1.0)` combines as `L1`).
pub(crate) fn norm_of_p(p: f32) -> Norm {
    if p == 2.0 {
        Norm::L2
    } else if p == f32::INFINITY {
        Norm::Inf
    } else {
        Norm::P(p)
    }
}

/// FNV-1a over everything that decides how partials combine and what the
/// coefficient is; never [`MISMATCH`].
pub(crate) fn fingerprint(clip: &ClipNorm) -> u32 {
    let semantics = match clip.semantics() {
        Semantics::Torch => 0u32,
        Semantics::TensorFlow => 1,
    };
    let flags = clip.errors_if_nonfinite() as u32
        | (clip.unscales() as u32) << 1
        | (clip.is_per_tensor() as u32) << 2
        | (clip.reports_tensor_norms() as u32) << 3;
    let words = [
        clip.max_norm().to_bits(),
        norm_p(clip.norm_order()).to_bits(),
        semantics,
        flags,
    ];
    let mut hash = 0x811c_9dc5u32;
    for byte in words.iter().flat_map(|w| w.to_le_bytes()) {
        hash = (hash ^ byte as u32).wrapping_mul(0x0100_0193);
    }
    if hash == MISMATCH {
        1
    } else {
        hash
    }
}

impl Wire {
    /// What rank `rank` sends: its partial, or the news that it failed.
    pub fn new(rank: i32, clip: &ClipNorm, partial: Option<NormPartial>) -> Self {
        let base = Wire {
            p_bits: norm_p(clip.norm_order()).to_bits(),
            fingerprint: fingerprint(clip),
            first_failed: NO_RANK,
            ..Wire::default()
        };
        match partial {
            Some(partial) => Wire {
                partial: bytemuck::cast(partial.to_bytes()),
                ..base
            },
            None => Wire {
                failed: 1,
                first_failed: rank as u32,
                ..base
            },
        }
    }

    /// The partial this record carries; an error for bits no reduction
    /// produces (a corrupted record, or a rank on another build).
    pub fn partial(&self) -> gradclip::Result<NormPartial> {
        NormPartial::from_bytes(bytemuck::cast(self.partial))
    }

    /// Folds `other` into `self`: the bookkeeping always, the partials only
    /// while no rank failed and the clips agree.
    fn merge(&mut self, other: &Wire) {
        self.failed += other.failed;
        self.first_failed = self.first_failed.min(other.first_failed);
        if self.fingerprint != other.fingerprint {
            self.fingerprint = MISMATCH;
        }
        if self.failed != 0 || self.fingerprint == MISMATCH {
            return;
        }
        let norm = norm_of_p(f32::from_bits(self.p_bits));
        let both = other
            .partial()
            .and_then(|o| Ok([o, self.partial()?]))
            .and_then(|parts| NormPartial::combine(&parts, norm));
        match both {
            Ok(both) => self.partial = bytemuck::cast(both.to_bytes()),
            // Bits no reduction of this norm produces: treat them as a
            // disagreement rather than trust them.
            Err(_) => self.fingerprint = MISMATCH,
        }
    }
}

/// What the exchange decided, the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Every rank recorded its norm with the same clip: the combined partial.
    Combined(NormPartial),
    Failed {
        rank: i32,
        count: u32,
    },
    Mismatch,
}

impl From<&Wire> for Outcome {
    fn from(total: &Wire) -> Self {
        if total.failed != 0 {
            Outcome::Failed {
                rank: total.first_failed as i32,
                count: total.failed,
            }
        } else if total.fingerprint == MISMATCH {
            Outcome::Mismatch
        } else {
            match total.partial() {
                Ok(partial) => Outcome::Combined(partial),
                Err(_) => Outcome::Mismatch,
            }
        }
    }
}

/// The all-gather path: every rank holds every record, in rank order, and
/// combines the partials in one `NormPartial::combine` (one rounding, the
/// same bits everywhere and the same as one process combining them).
pub(crate) fn combine_gathered(records: &[Wire]) -> Outcome {
    let Some(first) = records.first() else {
        return Outcome::Mismatch;
    };
    let mut total = *first;
    for r in &records[1..] {
        total.failed += r.failed;
        total.first_failed = total.first_failed.min(r.first_failed);
        if total.fingerprint != r.fingerprint {
            total.fingerprint = MISMATCH;
        }
    }
    if total.failed != 0 || total.fingerprint == MISMATCH {
        return Outcome::from(&total);
    }
    let norm = norm_of_p(f32::from_bits(total.p_bits));
    let combined = records
        .iter()
        .map(Wire::partial)
        .collect::<gradclip::Result<Vec<NormPartial>>>()
        .and_then(|partials| NormPartial::combine(&partials, norm));
    match combined {
        Ok(combined) => Outcome::Combined(combined),
        Err(_) => Outcome::Mismatch,
    }
}

/// The user-defined MPI operation of the all-reduce path:
/// `inoutvec[i] = invec[i] ⊕ inoutvec[i]` over records of the 32-byte
/// contiguous datatype the exchange declares (so MPI never splits one).
///
/// # Safety
/// MPI calls it with `len` records at each pointer, of the datatype the
/// all-reduce was given: [`Wire`]s. It never panics (MPI would abort).
pub(crate) unsafe extern "C" fn combine_op(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut mpi::ffi::MPI_Datatype,
) {
    let n = if len.is_null() {
        0
    } else {
        (*len).max(0) as usize
    };
    if n == 0 {
        return;
    }
    // SAFETY: MPI hands over `n` records of our datatype at each pointer,
    // distinct buffers, 4-byte aligned (they hold u32 words).
    let inputs = core::slice::from_raw_parts(invec as *const Wire, n);
    let outputs = core::slice::from_raw_parts_mut(inoutvec as *mut Wire, n);
    for (out, input) in outputs.iter_mut().zip(inputs) {
        out.merge(input);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(rank: i32, clip: &ClipNorm, bytes: [u8; 16]) -> Wire {
        Wire::new(rank, clip, Some(NormPartial::from_bytes(bytes).unwrap()))
    }

    /// L2 partials are Blue's three sums: small, medium and big.
    fn l2(medium: f32) -> [u8; 16] {
        bytemuck::cast([0.0f32, medium, 0.0, 0.0])
    }

    #[test]
    fn gathered_l2_partials_sum() {
        let clip = ClipNorm::new(1.0);
        let records = [wire(0, &clip, l2(9.0)), wire(1, &clip, l2(16.0))];
        match combine_gathered(&records) {
            Outcome::Combined(p) => assert_eq!(p.total_norm(Norm::L2).unwrap(), 5.0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn op_matches_gather_for_two_and_reports_failures_and_mismatches() {
        let clip = ClipNorm::new(1.0);
        let a = wire(0, &clip, l2(9.0));
        let b = wire(1, &clip, l2(16.0));
        let mut out = [b];
        let mut len: c_int = 1;
        unsafe {
            combine_op(
                [a].as_mut_ptr() as *mut c_void,
                out.as_mut_ptr() as *mut c_void,
                &mut len,
                core::ptr::null_mut(),
            )
        };
        assert_eq!(Outcome::from(&out[0]), combine_gathered(&[a, b]));

        let failed = Wire::new(3, &clip, None);
        let mut total = a;
        total.merge(&failed);
        total.merge(&Wire::new(2, &clip, None));
        assert_eq!(Outcome::from(&total), Outcome::Failed { rank: 2, count: 2 });
        assert_eq!(
            combine_gathered(&[a, failed, b]),
            Outcome::Failed { rank: 3, count: 1 }
        );

        let other = wire(1, &ClipNorm::new(1.0).norm(Norm::L1), l2(16.0));
        let mut total = a;
        total.merge(&other);
        assert_eq!(Outcome::from(&total), Outcome::Mismatch);
        assert_eq!(combine_gathered(&[a, other]), Outcome::Mismatch);
        // Failure outranks disagreement, in both paths.
        total.merge(&failed);
        assert!(matches!(Outcome::from(&total), Outcome::Failed { .. }));
    }

    #[test]
    fn fingerprint_sees_every_option() {
        let base = ClipNorm::new(1.0);
        let variants = [
            base,
            ClipNorm::new(2.0),
            base.norm(Norm::Inf),
            base.norm(Norm::P(3.0)),
            ClipNorm::tensorflow(1.0),
            base.error_if_nonfinite(true),
            base.unscale(true),
            base.per_tensor(true),
            base.tensor_norms(true),
        ];
        let prints: Vec<u32> = variants.iter().map(fingerprint).collect();
        for (i, a) in prints.iter().enumerate() {
            assert_ne!(*a, MISMATCH);
            for b in &prints[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(fingerprint(&base.norm(Norm::L2)), fingerprint(&base));
    }

    #[test]
    fn norm_orders_round_trip() {
        for norm in [Norm::L2, Norm::Inf, Norm::P(3.0), Norm::P(0.5)] {
            assert_eq!(norm_of_p(norm_p(norm)), norm);
        }
        assert_eq!(norm_of_p(norm_p(Norm::L1)), Norm::P(1.0));
    }
}
