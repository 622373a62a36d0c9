//! `NormPartial`: the part of a global norm one shard of the gradients
//! contributes, in a form that combines exactly across shards.

use crate::config::Norm;
use crate::error::{Error, Result};
use crate::records::{Partial, FLAG_INF, FLAG_NAN};

/// The reduction of one shard's gradients — the un-rooted `Σ|g|^p` (or the
/// max, for Inf) with its non-finite flags — in the overflow-safe scaled form
/// the shaders use. Data- and pipeline-parallel ranks each
/// [`record_norm`](crate::GradSet::record_norm), exchange these 16 bytes
/// ([`to_bytes`](Self::to_bytes)), [`combine`](Self::combine) them, and clip
/// with the combined one ([`clip_with_partial`](crate::GradSet::clip_with_partial)).
///
/// Partials hold only what a reduction can produce: [`from_bytes`](Self::from_bytes)
/// rejects other bits, and [`combine`](Self::combine),
/// [`total_norm`](Self::total_norm) and the GPU (`clip_with_partial_from`)
/// apply the same rules for each norm, so they agree on every partial they accept.
///
/// ```
/// use gradclip::{NormPartial, Norm};
/// let zero = NormPartial::default();
/// let both = NormPartial::combine(&[zero, zero], Norm::L2)?;
/// assert_eq!(both.total_norm(Norm::L2)?, 0.0);
/// // A stray flag bit is no partial at all.
/// let mut bytes = zero.to_bytes();
/// bytes[12] = 0x40;
/// assert!(matches!(NormPartial::from_bytes(bytes), Err(gradclip::Error::InvalidPartial(_))));
/// # Ok::<(), gradclip::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NormPartial(pub(crate) Partial);

/// The p of a norm for the scaled p-sum form; None for L2 and Inf, which have their own forms.
fn general_p(norm: Norm) -> Result<Option<f64>> {
    let (reduction, config) = crate::ClipNorm::new(1.0).norm(norm).to_record()?;
    Ok(match reduction {
        crate::config::Reduction::P { .. } => Some(config.p as f64),
        _ => None,
    })
}

fn is_inf(norm: Norm) -> bool {
    matches!(norm, Norm::Inf) || matches!(norm, Norm::P(p) if p == f32::INFINITY)
}

impl NormPartial {
    /// The 16 bytes to send to other ranks (and what the GPU buffer holds).
    pub fn to_bytes(&self) -> [u8; 16] {
        bytemuck::cast(self.0)
    }

    /// Rebuilds a partial from [`to_bytes`](Self::to_bytes). Fails with
    /// [`Error::InvalidPartial`] on flag bits other than inf and NaN, on
    /// values that are infinite or NaN, on a first or second value that is
    /// negative (`-0.0` included) and on a third value of `-0.0`: no reduction
    /// of any norm produces them. (The third value is negative only as the
    /// exponent of a general-p partial; rules that depend on the norm are
    /// checked where the norm is known.)
    pub fn from_bytes(bytes: [u8; 16]) -> Result<Self> {
        let partial = Self(bytemuck::cast(bytes));
        partial.check_bits()?;
        Ok(partial)
    }

    fn check_bits(&self) -> Result<()> {
        if self.0.flags & !(FLAG_INF | FLAG_NAN) != 0 {
            return Err(Error::InvalidPartial("flag bits other than inf and NaN"));
        }
        let [a, b, c] = self.0.v;
        if !(a.is_finite() && b.is_finite() && c.is_finite()) {
            return Err(Error::InvalidPartial("a value is infinite or NaN"));
        }
        if a.is_sign_negative() || b.is_sign_negative() || c.to_bits() == 0x8000_0000 {
            return Err(Error::InvalidPartial(
                "a sum or maximum is negative, or the exponent is -0",
            ));
        }
        Ok(())
    }

    /// Checks that a reduction of `norm` can produce this partial: the rules
    /// of [`from_bytes`](Self::from_bytes), and for Inf `(max, 0, 0)`, for
    /// general p either all zero or `(s >= 1, m in [1, 2), E an integer in
    /// [-149, 127])`. The GPU applies the same rules to a supplied partial.
    pub fn check(&self, norm: Norm) -> Result<()> {
        self.check_bits()?;
        let [a, b, c] = self.0.v;
        if general_p(norm)?.is_none() && c.is_sign_negative() {
            return Err(Error::InvalidPartial(
                "an L2 or Inf partial has no negative value",
            ));
        }
        if is_inf(norm) {
            if b != 0.0 || c != 0.0 {
                return Err(Error::InvalidPartial(
                    "an Inf partial has only its first value",
                ));
            }
        } else if general_p(norm)?.is_some() {
            let empty = a == 0.0 && b == 0.0 && c == 0.0;
            let sum = a >= 1.0
                && (1.0..2.0).contains(&b)
                && c == c.floor()
                && (-149.0..=127.0).contains(&c);
            if !(empty || sum) {
                return Err(Error::InvalidPartial(
                    "a p partial is (s >= 1, m in [1, 2), integer E) or all zero",
                ));
            }
        }
        Ok(())
    }

    /// Whether some element of the shard was NaN or infinite.
    pub fn nonfinite(&self) -> bool {
        self.0.flags & (FLAG_INF | FLAG_NAN) != 0
    }

    /// Combines shards' partials of the same norm order into the partial of
    /// all of them (sums of scaled powers, or the max), exactly as the
    /// finalize pass folds chunks. Order does not matter beyond rounding.
    pub fn combine(parts: &[NormPartial], norm: Norm) -> Result<NormPartial> {
        let p = general_p(norm)?;
        for part in parts {
            part.check(norm)?;
        }
        let flags = parts.iter().fold(0, |f, q| f | q.0.flags);
        let v = if is_inf(norm) {
            let top = parts.iter().map(|q| q.0.v[0].to_bits()).max().unwrap_or(0);
            [f32::from_bits(top), 0.0, 0.0]
        } else if let Some(p) = p {
            // (s, m, E): s = Σ (|g| / (m 2^E))^p; rescale each to the largest.
            let top = parts
                .iter()
                .filter(|q| q.0.v[0] > 0.0)
                .map(|q| (q.0.v[2], q.0.v[1]))
                .fold(None, |best: Option<(f32, f32)>, x| match best {
                    Some(b) if (b.0, b.1) >= x => Some(b),
                    _ => Some(x),
                });
            match top {
                None => [0.0; 3],
                Some((e, m)) => {
                    let s: f64 = parts
                        .iter()
                        .filter(|q| q.0.v[0] > 0.0)
                        .map(|q| {
                            let ratio = (q.0.v[1] as f64 / m as f64).log2() + (q.0.v[2] - e) as f64;
                            q.0.v[0] as f64 * (p * ratio).exp2()
                        })
                        .sum();
                    [s as f32, m, e]
                }
            }
        } else {
            let mut sums = [0f64; 3];
            for q in parts {
                for (sum, v) in sums.iter_mut().zip(q.0.v) {
                    *sum += v as f64;
                }
            }
            sums.map(|s| s as f32)
        };
        let combined = NormPartial(Partial { v, flags });
        // A sum past f32::MAX is no partial either (2^40 squares of up to 2^88 per bin are).
        combined.check(norm)?;
        Ok(combined)
    }

    /// The norm this partial stands for, computed on the CPU in float64 (for
    /// logging; the GPU computes the same from it in `clip_with_partial`).
    /// NaN or inf if an element was.
    pub fn total_norm(&self, norm: Norm) -> Result<f64> {
        let p = general_p(norm)?;
        self.check(norm)?;
        if self.0.flags & FLAG_NAN != 0 {
            return Ok(f64::NAN);
        }
        if self.0.flags & FLAG_INF != 0 {
            return Ok(f64::INFINITY);
        }
        let [a, b, c] = self.0.v.map(|x| x as f64);
        Ok(if is_inf(norm) {
            a
        } else if let Some(p) = p {
            if a == 0.0 {
                0.0
            } else {
                b * c.exp2() * a.powf(1.0 / p)
            }
        } else {
            (a * (-172f64).exp2() + b + c * 168f64.exp2()).sqrt()
        })
    }
}

impl From<NormPartial> for [u8; 16] {
    fn from(p: NormPartial) -> Self {
        p.to_bytes()
    }
}
