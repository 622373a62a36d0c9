//! `LossScaler`: the parameters of dynamic loss scaling, run on the GPU.

use crate::error::{Error, Result};
use crate::records::ScalerConfig;

/// Dynamic loss scaling with `torch.amp.GradScaler`'s rules, kept and
/// updated on the GPU: every [`GradSet`](crate::GradSet) carries a loss
/// scale `S` in its stats buffer, and a clip made with
/// [`ClipNorm::unscale`](crate::ClipNorm::unscale) divides the gradients by
/// `S`, sets `found_inf` when an element is NaN or infinite (then leaving
/// the gradients as they are) and updates `S` as `GradScaler.update` does:
/// `S *= backoff_factor` on a non-finite step, `S *= growth_factor` after
/// `growth_interval` finite steps in a row (unless that overflows). No
/// readback is needed: loss and optimizer shaders read `S` and `found_inf`
/// from [`GradSet::coefficient_binding`](crate::GradSet::coefficient_binding).
///
/// The defaults are GradScaler's: `init_scale = 2^16`, `growth_factor = 2`,
/// `backoff_factor = 0.5`, `growth_interval = 2000`.
///
/// ```
/// let scaler = gradclip::LossScaler::new().init_scale(1024.0).growth_interval(100);
/// assert_eq!(scaler.growth_factor_value(), 2.0);
/// assert!(gradclip::LossScaler::new().growth_factor(0.5).check().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaler {
    init_scale: f32,
    growth_factor: f32,
    backoff_factor: f32,
    growth_interval: u32,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self::new()
    }
}

impl LossScaler {
    /// GradScaler's defaults.
    pub fn new() -> Self {
        Self {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }

    /// The scale to start from (finite, at least the smallest normal f32).
    pub fn init_scale(self, init_scale: f32) -> Self {
        Self { init_scale, ..self }
    }

    /// Factor the scale grows by after `growth_interval` finite steps (> 1, finite).
    pub fn growth_factor(self, growth_factor: f32) -> Self {
        Self {
            growth_factor,
            ..self
        }
    }

    /// Factor the scale shrinks by on a non-finite step (in (0, 1)).
    pub fn backoff_factor(self, backoff_factor: f32) -> Self {
        Self {
            backoff_factor,
            ..self
        }
    }

    /// Finite steps in a row before the scale grows (at least 1).
    pub fn growth_interval(self, growth_interval: u32) -> Self {
        Self {
            growth_interval,
            ..self
        }
    }

    /// The initial scale.
    pub fn init_scale_value(&self) -> f32 {
        self.init_scale
    }

    /// The growth factor.
    pub fn growth_factor_value(&self) -> f32 {
        self.growth_factor
    }

    /// The backoff factor.
    pub fn backoff_factor_value(&self) -> f32 {
        self.backoff_factor
    }

    /// The growth interval.
    pub fn growth_interval_value(&self) -> u32 {
        self.growth_interval
    }

    /// Checks the parameters: GradScaler's constructor asserts
    /// `growth_factor > 1` and `backoff_factor < 1`; this also wants
    /// `backoff_factor > 0`, `growth_interval >= 1` (GradScaler would never
    /// grow with 0) and a normal positive initial scale (a subnormal one
    /// unscales by inf in PyTorch: every step would be skipped).
    pub fn check(&self) -> Result<()> {
        let s = self.init_scale;
        if !s.is_normal() || s < 0.0 {
            return Err(Error::InvalidLossScaler(
                "init_scale must be a positive normal f32",
            ));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return Err(Error::InvalidLossScaler(
                "growth_factor must be finite and > 1",
            ));
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return Err(Error::InvalidLossScaler("backoff_factor must be in (0, 1)"));
        }
        if self.growth_interval == 0 {
            return Err(Error::InvalidLossScaler(
                "growth_interval must be at least 1",
            ));
        }
        Ok(())
    }

    pub(crate) fn config(&self) -> ScalerConfig {
        ScalerConfig {
            growth_factor: self.growth_factor,
            backoff_factor: self.backoff_factor,
            growth_interval: self.growth_interval,
            _pad: 0,
        }
    }
}
