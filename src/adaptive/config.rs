//! The adaptive methods' parameters, checked on the host and written once
//! into the adaptive pass's uniform.

use bytemuck::{Pod, Zeroable};

use crate::config::Semantics;
use crate::error::{Error, Result};
use crate::records::{
    METHOD_ADAGC, METHOD_AUTOCLIP, METHOD_ZCLIP, P_CLIP_TO_MEAN, P_HAS_CAP, P_HISTOGRAM,
    P_INCLUDE_CURRENT, P_PERCENTILE_MODE, P_SKIP_ON_SPIKE, P_TENSORFLOW,
};

/// ZClip's `mode`: what counts as a spike and what it is clipped to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ZClipMode {
    /// The reference's default (`mode="zscore"`): a spike is a norm whose
    /// z-score `z = (g - μ) / (σ + eps)` exceeds `z_thresh`.
    ZScore(ZClipTo),
    /// The reference's `mode="percentile"` (a name kept from it; no
    /// percentile is taken): a spike is a norm above `μ + z_thresh · σ`, and
    /// is clipped to that value.
    Percentile,
}

/// What a z-score spike is clipped to (the reference's `clip_option`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ZClipTo {
    /// `"adaptive_scaling"` (the default): `(μ + z_thresh · σ / η) · clip_factor`
    /// with `η = z / z_thresh`, so a bigger spike is clipped harder.
    AdaptiveScaling,
    /// `"mean"`: `μ`.
    Mean,
}

/// ZClip (Kumar et al. 2025, "ZClip: Adaptive Spike Mitigation for LLM
/// Pre-Training"; the authors' `zclip.py`): an EMA of the mean and variance
/// of the total norm, started from the first `warmup_steps` finite norms
/// (their mean and population variance); after that, a spike is clipped and
/// the EMA is updated with the clipped value. The defaults are the
/// reference's.
///
/// ```
/// let z = gradclip::ZClip::new().z_thresh(3.0).warmup_steps(10);
/// assert_eq!((z.alpha, z.z_thresh, z.warmup_steps), (0.97, 3.0, 10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZClip {
    /// EMA factor: `μ ← α μ + (1 - α) x`. Default 0.97.
    pub alpha: f32,
    /// Z-score threshold. Default 2.5.
    pub z_thresh: f32,
    /// Added to σ in the z-score. Default 1e-6.
    pub eps: f32,
    /// Finite norms collected before the EMA starts (at least 1). Default 25.
    pub warmup_steps: u32,
    /// Default `ZScore(AdaptiveScaling)`.
    pub mode: ZClipMode,
    /// Multiplies the adaptive-scaling threshold. Default 1.
    pub clip_factor: f32,
    /// A fixed cap on top of the adaptive threshold, also applied during
    /// warm-up (the reference's `max_grad_norm`). Default `None`: the
    /// reference's README uses `None`, its constructor defaults to 1.0.
    pub max_norm: Option<f32>,
    /// Leave the EMA alone on a spike. Default `false` (the EMA takes the
    /// clipped value).
    pub skip_update_on_spike: bool,
}

impl Default for ZClip {
    fn default() -> Self {
        Self {
            alpha: 0.97,
            z_thresh: 2.5,
            eps: 1e-6,
            warmup_steps: 25,
            mode: ZClipMode::ZScore(ZClipTo::AdaptiveScaling),
            clip_factor: 1.0,
            max_norm: None,
            skip_update_on_spike: false,
        }
    }
}

impl ZClip {
    /// The reference's defaults.
    pub fn new() -> Self {
        Self::default()
    }
    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }
    pub fn z_thresh(mut self, z_thresh: f32) -> Self {
        self.z_thresh = z_thresh;
        self
    }
    pub fn eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }
    pub fn warmup_steps(mut self, steps: u32) -> Self {
        self.warmup_steps = steps;
        self
    }
    pub fn mode(mut self, mode: ZClipMode) -> Self {
        self.mode = mode;
        self
    }
    pub fn clip_factor(mut self, factor: f32) -> Self {
        self.clip_factor = factor;
        self
    }
    pub fn max_norm(mut self, max_norm: Option<f32>) -> Self {
        self.max_norm = max_norm;
        self
    }
    pub fn skip_update_on_spike(mut self, skip: bool) -> Self {
        self.skip_update_on_spike = skip;
        self
    }

    fn check(&self) -> Result<()> {
        let bad = |what| Err(Error::InvalidAdaptive(what));
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return bad("ZClip alpha must be in (0, 1)");
        }
        if !(self.z_thresh > 0.0 && self.z_thresh.is_finite()) {
            return bad("ZClip z_thresh must be positive and finite");
        }
        if !(self.eps >= 0.0 && self.eps.is_finite()) {
            return bad("ZClip eps must be non-negative and finite");
        }
        if self.warmup_steps == 0 {
            return bad("ZClip needs at least one warm-up step");
        }
        if !(self.clip_factor > 0.0 && self.clip_factor.is_finite()) {
            return bad("ZClip clip_factor must be positive and finite");
        }
        if self.max_norm.is_some_and(|m| !(m >= 0.0 && m.is_finite())) {
            return bad("ZClip max_norm must be non-negative and finite");
        }
        Ok(())
    }
}

/// AutoClip (Seetharaman et al. 2020, "AutoClip: Adaptive Gradient Clipping
/// for Source Separation Networks"): the threshold is the `percentile`-th
/// percentile (numpy's default linear interpolation) of the total norms seen,
/// here the last `window` finite ones, kept in a ring on the GPU and selected
/// exactly on the GPU. The paper keeps all of history:
/// [`all_history`](Self::all_history) counts every norm in a histogram on the
/// GPU (fixed size, any run length) at a bounded error.
///
/// ```
/// let a = gradclip::AutoClip::new(10.0).window(1000);
/// assert_eq!((a.percentile, a.window, a.include_current), (10.0, 1000, true));
/// let paper = gradclip::AutoClip::new(10.0).all_history(7);
/// assert_eq!(paper.bucket_bits, Some(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoClip {
    /// In [0, 100]; the paper recommends 10.
    pub percentile: f32,
    /// Norms kept (at least 1). Default 1000. The selection compares every
    /// pair, `window²` comparisons per step in one workgroup.
    pub window: u32,
    /// The step's own norm joins the history before the percentile is taken
    /// (the paper's code, the default); `false`: `QuantileClip` of the
    /// `autoclip` package, which takes it after (its first step never clips).
    pub include_current: bool,
    /// `Some(m)`: all of history instead of a window, each norm counted in
    /// the bucket of f32s that share its sign, exponent and first `m`
    /// mantissa bits (`255 · 2^m` buckets of 4 B; `m` in 0..=10), and the
    /// percentile taken over the buckets' lower edges: never above the
    /// exact percentile, and below it by less than a relative `2^-m` (m = 7:
    /// 0.8%, 128 KiB of state). `window` is then unused.
    pub bucket_bits: Option<u32>,
}

impl AutoClip {
    pub fn new(percentile: f32) -> Self {
        Self {
            percentile,
            window: 1000,
            include_current: true,
            bucket_bits: None,
        }
    }
    /// All of history, in buckets of `mantissa_bits` mantissa bits (see [`bucket_bits`](Self::bucket_bits)).
    pub fn all_history(mut self, mantissa_bits: u32) -> Self {
        self.bucket_bits = Some(mantissa_bits);
        self
    }
    pub fn window(mut self, window: u32) -> Self {
        self.window = window;
        self
    }
    pub fn include_current(mut self, include: bool) -> Self {
        self.include_current = include;
        self
    }

    fn check(&self, max_binding: u64) -> Result<()> {
        if !(0.0..=100.0).contains(&self.percentile) {
            return Err(Error::InvalidAdaptive(
                "AutoClip percentile must be in [0, 100]",
            ));
        }
        if let Some(m) = self.bucket_bits {
            if m > MAX_BUCKET_BITS {
                return Err(Error::InvalidAdaptive(
                    "AutoClip's histogram takes at most 10 mantissa bits",
                ));
            }
            if STATE_HEAD_SIZE + 4 * autoclip_buckets(m) as u64 > max_binding {
                return Err(Error::InvalidAdaptive(
                    "AutoClip's histogram larger than the device's storage binding limit",
                ));
            }
            return Ok(());
        }
        if self.window == 0 {
            return Err(Error::InvalidAdaptive(
                "AutoClip needs a window of at least 1",
            ));
        }
        if STATE_HEAD_SIZE + 4 * self.window as u64 > max_binding {
            return Err(Error::InvalidAdaptive(
                "AutoClip window larger than the device's storage binding limit",
            ));
        }
        Ok(())
    }
}

/// AdaGC (Wang et al. 2025, "AdaGC: Improving Training Stability for Large
/// Language Model Pretraining"; the authors' Megatron patch): per-tensor
/// thresholds. For the first `warmup_steps` finite steps every tensor is
/// clipped by the global norm at `lambda_abs`, and each tensor's `γ` keeps
/// the smallest of its norms after that clip; then tensor `i` is clipped to
/// `lambda_rel · γ_i` and `γ_i ← β γ_i + (1 − β) · min(‖g_i‖, lambda_rel · γ_i)`.
/// The defaults are the authors' (`clip_ratio=1.04, beta=0.99,
/// start_clip_steps=100`, `--clip-grad 1.0`).
///
/// ```
/// let a = gradclip::AdaGc::new().warmup_steps(10);
/// assert_eq!((a.lambda_rel, a.beta, a.warmup_steps), (1.04, 0.99, 10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaGc {
    /// The global threshold of the warm-up. Default 1.
    pub lambda_abs: f32,
    /// Tensor `i` is clipped to `lambda_rel · γ_i`. Default 1.04.
    pub lambda_rel: f32,
    /// EMA factor of `γ`. Default 0.99.
    pub beta: f32,
    /// Finite steps of global clipping first; 0: none (each `γ` then starts
    /// at its tensor's first finite norm). Default 100.
    pub warmup_steps: u32,
    /// The factor's formula (PyTorch's or TensorFlow's); the clips recorded
    /// must use the same. Default PyTorch.
    pub semantics: Semantics,
}

impl Default for AdaGc {
    fn default() -> Self {
        Self {
            lambda_abs: 1.0,
            lambda_rel: 1.04,
            beta: 0.99,
            warmup_steps: 100,
            semantics: Semantics::Torch,
        }
    }
}

impl AdaGc {
    /// The authors' defaults.
    pub fn new() -> Self {
        Self::default()
    }
    pub fn lambda_abs(mut self, lambda_abs: f32) -> Self {
        self.lambda_abs = lambda_abs;
        self
    }
    pub fn lambda_rel(mut self, lambda_rel: f32) -> Self {
        self.lambda_rel = lambda_rel;
        self
    }
    pub fn beta(mut self, beta: f32) -> Self {
        self.beta = beta;
        self
    }
    pub fn warmup_steps(mut self, steps: u32) -> Self {
        self.warmup_steps = steps;
        self
    }
    pub fn semantics(mut self, semantics: Semantics) -> Self {
        self.semantics = semantics;
        self
    }

    fn check(&self) -> Result<()> {
        let bad = |what| Err(Error::InvalidAdaptive(what));
        if !(self.lambda_abs >= 0.0 && self.lambda_abs.is_finite()) {
            return bad("AdaGC lambda_abs must be non-negative and finite");
        }
        if !(self.lambda_rel > 0.0 && self.lambda_rel.is_finite()) {
            return bad("AdaGC lambda_rel must be positive and finite");
        }
        if !(self.beta >= 0.0 && self.beta < 1.0) {
            return bad("AdaGC beta must be in [0, 1)");
        }
        Ok(())
    }
}

/// An adaptive clipping method.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AdaptiveMethod {
    ZClip(ZClip),
    AutoClip(AutoClip),
    AdaGc(AdaGc),
}

impl From<AdaGc> for AdaptiveMethod {
    fn from(a: AdaGc) -> Self {
        Self::AdaGc(a)
    }
}

impl From<ZClip> for AdaptiveMethod {
    fn from(z: ZClip) -> Self {
        Self::ZClip(z)
    }
}

impl From<AutoClip> for AdaptiveMethod {
    fn from(a: AutoClip) -> Self {
        Self::AutoClip(a)
    }
}

/// Most mantissa bits of AutoClip's histogram (1 MiB of buckets).
const MAX_BUCKET_BITS: u32 = 10;

/// Buckets of AutoClip's histogram of `m` mantissa bits: one per (exponent,
/// top `m` mantissa bits) of the finite non-negative f32s.
pub(crate) fn autoclip_buckets(m: u32) -> u32 {
    0x7f80_0000 >> (23 - m)
}

/// Bytes of WGSL `AdaptiveState` before its history.
pub(crate) const STATE_HEAD_SIZE: u64 = 64;

/// WGSL `AdaptiveParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub(crate) struct AdaptiveParams {
    pub method: u32,
    pub warmup: u32,
    pub capacity: u32,
    pub flags: u32,
    pub alpha: f32,
    pub z_thresh: f32,
    pub eps: f32,
    pub clip_factor: f32,
    pub cap: f32,
    pub percentile: f32,
    pub tensors: u32,
    pub ratio: f32,
    pub scale_workgroups: u32,
    pub bucket_shift: u32,
    pub _pad: [u32; 2],
}

impl AdaptiveMethod {
    /// The checked parameters as the shader reads them, for a set of
    /// `tensors` tensors whose per-tensor scale pass takes `scale_workgroups`.
    pub(crate) fn to_params(
        self,
        max_binding: u64,
        tensors: u32,
        scale_workgroups: u32,
    ) -> Result<AdaptiveParams> {
        Ok(match self {
            AdaptiveMethod::ZClip(z) => {
                z.check()?;
                let mut flags = 0;
                if z.max_norm.is_some() {
                    flags |= P_HAS_CAP;
                }
                match z.mode {
                    ZClipMode::Percentile => flags |= P_PERCENTILE_MODE,
                    ZClipMode::ZScore(ZClipTo::Mean) => flags |= P_CLIP_TO_MEAN,
                    ZClipMode::ZScore(ZClipTo::AdaptiveScaling) => {}
                }
                if z.skip_update_on_spike {
                    flags |= P_SKIP_ON_SPIKE;
                }
                if STATE_HEAD_SIZE + 4 * z.warmup_steps as u64 > max_binding {
                    return Err(Error::InvalidAdaptive(
                        "ZClip warm-up longer than the device's storage binding limit",
                    ));
                }
                AdaptiveParams {
                    method: METHOD_ZCLIP,
                    warmup: z.warmup_steps,
                    capacity: z.warmup_steps,
                    flags,
                    alpha: z.alpha,
                    z_thresh: z.z_thresh,
                    eps: z.eps,
                    clip_factor: z.clip_factor,
                    cap: z.max_norm.unwrap_or(0.0),
                    ..Default::default()
                }
            }
            AdaptiveMethod::AutoClip(a) => {
                a.check(max_binding)?;
                let mut flags = if a.include_current {
                    P_INCLUDE_CURRENT
                } else {
                    0
                };
                let (capacity, bucket_shift) = match a.bucket_bits {
                    Some(m) => {
                        flags |= P_HISTOGRAM;
                        (autoclip_buckets(m), 23 - m)
                    }
                    None => (a.window, 0),
                };
                AdaptiveParams {
                    method: METHOD_AUTOCLIP,
                    capacity,
                    flags,
                    percentile: a.percentile,
                    bucket_shift,
                    ..Default::default()
                }
            }
            AdaptiveMethod::AdaGc(a) => {
                a.check()?;
                let capacity = tensors
                    .checked_mul(4)
                    .filter(|&c| STATE_HEAD_SIZE + 4 * c as u64 <= max_binding);
                let Some(capacity) = capacity else {
                    return Err(Error::InvalidAdaptive(
                        "AdaGC's per-tensor state exceeds the device's storage binding limit",
                    ));
                };
                AdaptiveParams {
                    method: METHOD_ADAGC,
                    warmup: a.warmup_steps,
                    capacity,
                    flags: if a.semantics == Semantics::TensorFlow {
                        P_TENSORFLOW
                    } else {
                        0
                    },
                    alpha: a.beta,
                    cap: a.lambda_abs,
                    tensors,
                    ratio: a.lambda_rel,
                    scale_workgroups,
                    ..Default::default()
                }
            }
        })
    }
}
