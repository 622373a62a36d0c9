//! What a clip computes: the norm, its order and the framework semantics.

use crate::error::{Error, Result};
use crate::records::{
    ClipConfig, CFG_ERROR_IF_NONFINITE, CFG_PER_TENSOR, CFG_TENSOR_NORMS, CFG_UNSCALE,
    SEMANTICS_TENSORFLOW, SEMANTICS_TORCH,
};
use crate::shaders::MAX_POWER;

/// The order of the global norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Norm {
    /// Sum of absolute values.
    L1,
    /// Euclidean norm, overflow- and underflow-safe.
    L2,
    /// Largest absolute value.
    Inf,
    /// `(Σ|g|^p)^(1/p)` for `p >= Norm::MIN_P`; `P(2.0)` is `L2`, `P(1.0)`
    /// is `L1` and `P(f32::INFINITY)` is `Inf`. Any such p is computed without
    /// over- or underflow: for tiny p the norm of two or more non-zero
    /// elements is far beyond f32 (reported as inf) and the clip factor,
    /// computed from its exact form, is 0, as in PyTorch.
    P(f32),
}

impl Norm {
    /// The smallest order `Norm::P` accepts: the smallest normal f32. A
    /// subnormal p has no finite reciprocal, and drivers that flush
    /// subnormals would read it as 0.
    pub const MIN_P: f32 = f32::MIN_POSITIVE;
}

/// Whose definition of the clip coefficient to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Semantics {
    /// `torch.nn.utils.clip_grad_norm_`: `min(1, max_norm / (norm + 1e-6))`.
    Torch,
    /// `tf.clip_by_global_norm`: `clip_norm / max(norm, clip_norm)`.
    TensorFlow,
}

/// Which reduction a clip runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduction {
    L2,
    Inf,
    /// General p. `power` is p when p is an integer from 1 to
    /// [`MAX_POWER`], for which the reduce pipeline is specialised (the
    /// shaders' `POWER` override), and 0 for any other p.
    P {
        power: u32,
    },
}

impl Reduction {
    /// How many there are: pipelines specialised per reduction come in arrays of this length.
    pub const COUNT: usize = 3;
    /// Reduce pipelines: one per reduction and one more per integer power.
    pub const REDUCE_VARIANTS: usize = Self::COUNT + MAX_POWER as usize;

    /// The general-p reduction of order `p`.
    pub fn p(p: f32) -> Self {
        let integer = p.fract() == 0.0 && (1.0..=MAX_POWER as f32).contains(&p);
        Reduction::P {
            power: if integer { p as u32 } else { 0 },
        }
    }

    /// The value of the reduce shader's `POWER` override.
    pub fn power(self) -> u32 {
        match self {
            Reduction::P { power } => power,
            _ => 0,
        }
    }

    /// Whether it is a p that is not an integer from 1 to [`MAX_POWER`]
    /// (WGSL `general_p()`): its reduce walk follows a running maximum,
    /// and its tracked walk keeps two-word slots.
    pub fn general_p(self) -> bool {
        matches!(self, Reduction::P { power: 0 })
    }

    /// Which of the [`REDUCE_VARIANTS`](Self::REDUCE_VARIANTS) reduce pipelines runs it.
    pub fn reduce_variant(self) -> usize {
        self.kind() as usize + self.power() as usize
    }

    /// The value of the shaders' `KIND` override.
    pub fn kind(self) -> u32 {
        match self {
            Reduction::L2 => 0,
            Reduction::Inf => 1,
            Reduction::P { .. } => 2,
        }
    }
}

/// A global-norm clip: the gradients, taken as one concatenated vector, are
/// multiplied by a coefficient computed from their norm.
///
/// ```
/// use gradclip::{ClipNorm, Norm};
/// let torch_like = ClipNorm::new(1.0).norm(Norm::L2).error_if_nonfinite(true);
/// let tf_like = ClipNorm::tensorflow(5.0);
/// assert_eq!(torch_like.max_norm(), 1.0);
/// assert_eq!(tf_like.semantics(), gradclip::Semantics::TensorFlow);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipNorm {
    max_norm: f32,
    norm: Norm,
    semantics: Semantics,
    error_if_nonfinite: bool,
    per_tensor: bool,
    tensor_norms: bool,
    unscale: bool,
}

impl ClipNorm {
    /// PyTorch's `clip_grad_norm_(max_norm)`: L2 norm, coefficient
    /// `min(1, max_norm / (total + 1e-6))`. A NaN or infinite total spreads
    /// exactly as in PyTorch unless [`error_if_nonfinite`](Self::error_if_nonfinite) is set.
    pub fn new(max_norm: f32) -> Self {
        Self {
            max_norm,
            norm: Norm::L2,
            semantics: Semantics::Torch,
            error_if_nonfinite: false,
            per_tensor: false,
            tensor_norms: false,
            unscale: false,
        }
    }

    /// TensorFlow's `clip_by_global_norm(clip_norm)`: L2 norm, gradients
    /// multiplied by `clip_norm / max(norm, clip_norm)` (no epsilon; a zero
    /// norm leaves them unchanged; a non-finite norm makes them all NaN).
    pub fn tensorflow(clip_norm: f32) -> Self {
        Self {
            semantics: Semantics::TensorFlow,
            ..Self::new(clip_norm)
        }
    }

    /// Sets the order of the norm.
    pub fn norm(self, norm: Norm) -> Self {
        Self { norm, ..self }
    }

    /// With `true`, a NaN or infinite total norm leaves every gradient
    /// untouched and makes `read_report` return [`Error::NonFinite`].
    pub fn error_if_nonfinite(self, on: bool) -> Self {
        Self {
            error_if_nonfinite: on,
            ..self
        }
    }

    /// With `true`, each tensor is clipped by its own norm instead of the
    /// global one (`tf.clip_by_norm` per tensor, Keras `clipnorm`, burn's
    /// `GradientClipping::Norm`): coefficient `min(1, max_norm / (‖t‖ + 1e-6))`
    /// under PyTorch semantics, `max_norm / max(‖t‖, max_norm)` under
    /// TensorFlow's. The report still carries the global norm, and the
    /// per-tensor norms and coefficients. A tensor alone in its layout gets
    /// the global norm's and coefficient's bits as its own, so clipping it
    /// per tensor leaves the same bits as clipping it globally.
    pub fn per_tensor(self, on: bool) -> Self {
        Self {
            per_tensor: on,
            ..self
        }
    }

    /// With `true`, the report carries every tensor's norm (for logging per
    /// layer, as Lightning's `grad_norm` does), at the cost of a larger readback.
    pub fn tensor_norms(self, on: bool) -> Self {
        Self {
            tensor_norms: on,
            ..self
        }
    }

    /// With `true`, the clip is PyTorch's `GradScaler.unscale_` + clip +
    /// `GradScaler.update` in two passes over the gradients: the gradients
    /// hold `S · g` for the set's loss scale `S` (see
    /// [`LossScaler`](crate::LossScaler)); the norm is that of `g = stored / S`
    /// (computed exactly from the stored values, never materialising `g`),
    /// and the scale pass multiplies by `coefficient / S` in one go. If any
    /// element is NaN or infinite, `found_inf` is set, the gradients are left
    /// as they are (the optimizer step is to be skipped) and the report says
    /// so. Either way finalize then updates `S` with GradScaler's rules, on
    /// the GPU. The report's `coefficient` is the factor applied to the
    /// stored gradients (`clip coefficient / S`), its `total_norm` the
    /// unscaled norm.
    ///
    /// Every unscaling clip updates `S` (with `record_norm` and
    /// `clip_with_partial` too), so record exactly one per training step.
    /// Sharded ranks exchange the partials of the stored values
    /// (`record_norm` without `unscale`) and unscale in `clip_with_partial`:
    /// all ranks then reach the same `found_inf` and `S`.
    ///
    /// ```
    /// let amp = gradclip::ClipNorm::new(1.0).unscale(true);
    /// assert!(amp.unscales());
    /// ```
    pub fn unscale(self, on: bool) -> Self {
        Self {
            unscale: on,
            ..self
        }
    }

    /// Whether the clip divides by the loss scale and updates it.
    pub fn unscales(&self) -> bool {
        self.unscale
    }

    /// Whether each tensor is clipped by its own norm.
    pub fn is_per_tensor(&self) -> bool {
        self.per_tensor
    }

    /// Whether per-tensor norms are computed and reported.
    pub fn reports_tensor_norms(&self) -> bool {
        self.tensor_norms || self.per_tensor
    }

    /// The threshold the norm is clipped to.
    pub fn max_norm(&self) -> f32 {
        self.max_norm
    }

    /// The order of the norm.
    pub fn norm_order(&self) -> Norm {
        self.norm
    }

    /// Whose coefficient formula applies.
    pub fn semantics(&self) -> Semantics {
        self.semantics
    }

    /// Whether a non-finite norm is an error.
    pub fn errors_if_nonfinite(&self) -> bool {
        self.error_if_nonfinite
    }

    /// Checks the parameters and returns the reduction to run and the record
    /// the shaders read.
    pub(crate) fn to_record(self) -> Result<(Reduction, ClipConfig)> {
        let m = self.max_norm;
        let positive_needed = self.semantics == Semantics::TensorFlow;
        if !m.is_finite() || m < 0.0 || (positive_needed && m == 0.0) {
            return Err(Error::InvalidMaxNorm(m));
        }
        let (reduction, p) = match self.norm {
            Norm::L2 => (Reduction::L2, 2.0),
            Norm::Inf => (Reduction::Inf, f32::INFINITY),
            Norm::L1 => (Reduction::p(1.0), 1.0),
            Norm::P(p) if p.is_nan() || p < Norm::MIN_P => return Err(Error::InvalidNormOrder(p)),
            Norm::P(p) if p == f32::INFINITY => (Reduction::Inf, p),
            Norm::P(p) if p == 2.0 => (Reduction::L2, p),
            Norm::P(p) => (Reduction::p(p), p),
        };
        let semantics = match self.semantics {
            Semantics::Torch => SEMANTICS_TORCH,
            Semantics::TensorFlow => SEMANTICS_TENSORFLOW,
        };
        Ok((
            reduction,
            ClipConfig {
                semantics,
                p,
                max_norm: m,
                flags: [
                    (self.per_tensor, CFG_PER_TENSOR),
                    (self.tensor_norms, CFG_TENSOR_NORMS),
                    (self.unscale, CFG_UNSCALE),
                    (self.error_if_nonfinite, CFG_ERROR_IF_NONFINITE),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .fold(0, |flags, (_, bit)| flags | bit),
                ..ClipConfig::default()
            },
        ))
    }
}

/// The record for `clip_value(min, max)`, checked.
pub(crate) fn clamp_record(min: f32, max: f32) -> Result<ClipConfig> {
    if min.is_nan() || max.is_nan() || min > max {
        return Err(Error::InvalidClampRange { min, max });
    }
    Ok(ClipConfig {
        clamp_min: min,
        clamp_max: max,
        ..ClipConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_orders_get_their_own_reduce_pipeline() {
        let power = |norm| ClipNorm::new(1.0).norm(norm).to_record().unwrap().0.power();
        assert_eq!(power(Norm::L1), 1);
        for p in 1..=MAX_POWER {
            assert_eq!(
                power(Norm::P(p as f32)),
                if p == 2 { 0 } else { p },
                "p = {p}"
            );
        }
        for p in [0.5, 1.5, 2.5, MAX_POWER as f32 + 1.0, 1e30] {
            assert_eq!(power(Norm::P(p)), 0, "p = {p}");
        }
        // Every reduction and power has a pipeline cell of its own.
        let mut variants: Vec<usize> = [Reduction::L2, Reduction::Inf]
            .into_iter()
            .chain((0..=MAX_POWER).map(|power| Reduction::P { power }))
            .map(Reduction::reduce_variant)
            .collect();
        assert!(variants.iter().all(|&v| v < Reduction::REDUCE_VARIANTS));
        variants.sort();
        variants.dedup();
        assert_eq!(variants.len(), Reduction::REDUCE_VARIANTS);
    }

    #[test]
    fn misuse_is_rejected() {
        for bad in [-1.0, f32::NAN, f32::INFINITY] {
            assert!(matches!(
                ClipNorm::new(bad).to_record(),
                Err(Error::InvalidMaxNorm(_))
            ));
        }
        assert!(ClipNorm::new(0.0).to_record().is_ok());
        assert!(ClipNorm::new(1.0)
            .norm(Norm::P(Norm::MIN_P))
            .to_record()
            .is_ok());
        assert!(matches!(
            ClipNorm::tensorflow(0.0).to_record(),
            Err(Error::InvalidMaxNorm(_))
        ));
        for p in [0.0, -2.0, f32::NAN, 1e-39, f32::MIN_POSITIVE / 2.0] {
            assert!(matches!(
                ClipNorm::new(1.0).norm(Norm::P(p)).to_record(),
                Err(Error::InvalidNormOrder(_))
            ));
        }
        assert!(matches!(
            clamp_record(1.0, -1.0),
            Err(Error::InvalidClampRange { .. })
        ));
        assert!(matches!(
            clamp_record(f32::NAN, 1.0),
            Err(Error::InvalidClampRange { .. })
        ));
    }
}
