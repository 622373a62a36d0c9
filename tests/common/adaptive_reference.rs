//! Float64 references for the adaptive clipping methods (docs/adaptive.md),
//! written from the papers and their authors' code, never from a shader:
//!
//! - ZClip (Kumar et al. 2025; `bluorion-com/ZClip`, `zclip/zclip.py`),
//! - AutoClip (Seetharaman et al. 2020; `pseeth/autoclip`),
//! - AdaGC (Wang et al. 2025; the authors' Megatron patch, `lishuai-97/AdaGC`),
//! - AGC (Brock et al. 2021; Optax `adaptive_grad_clip` / `unitwise_norm`).
//!
//! The three stateful methods are step-by-step state machines fed with the
//! norms of the *unscaled* gradients (the float64 norm of the data uploaded,
//! not the target a generator aimed at). Every step reports the threshold,
//! the coefficient under the set's semantics, whether it clipped, and a
//! decision margin: how far the norm (or z-score) was from the value where
//! the `clipped` flag flips, so a GPU comparison can tell a real mismatch from
//! a float32 rounding on a knife's edge. A step whose norm is NaN or infinite
//! leaves the state exactly as it was (`skipped`).
//!
//! Also here: the deterministic generators the GPU tests share (the 500-step
//! norm sequence with spikes, a drift and a NaN step; per-tensor norms for
//! AdaGC; weights and gradients with zero-norm units for AGC). They use only
//! `+ - * /` and `sqrt` (correctly rounded everywhere), so native and wasm
//! builds produce the same bits.

use gradclip::Semantics;

// ---------------------------------------------------------------------------
// Shared pieces

/// What a clip multiplies the gradients by for a norm and a threshold (the
/// `max_norm` of a fixed clip), under gradclip's semantics:
/// PyTorch `min(1, τ / (norm + 1e-6))`, TensorFlow `τ / max(norm, τ)` (1 when
/// `norm <= τ`). `τ = +inf` means "no clipping this step": 1. A NaN norm
/// gives NaN; an infinite norm gives 0 under PyTorch (finite gradients × 0)
/// and NaN under TensorFlow, as gradclip's fixed clips do.
pub fn clip_coefficient(norm: f64, threshold: f64, semantics: Semantics) -> f64 {
    if norm.is_nan() {
        return f64::NAN;
    }
    if norm.is_infinite() {
        return match semantics {
            Semantics::Torch => 0.0,
            Semantics::TensorFlow => f64::NAN,
        };
    }
    if threshold == f64::INFINITY {
        return 1.0;
    }
    match semantics {
        Semantics::Torch => (threshold / (norm + 1e-6)).min(1.0),
        Semantics::TensorFlow => {
            if norm <= threshold {
                1.0
            } else {
                threshold / norm
            }
        }
    }
}

/// Relative distance of `x` from the value `at` where a decision flips;
/// infinite when there is no finite boundary.
pub fn margin(x: f64, at: f64) -> f64 {
    if !at.is_finite() || !x.is_finite() {
        return f64::INFINITY;
    }
    (x - at).abs() / at.abs().max(f64::MIN_POSITIVE)
}

/// One step of a method that clips the global norm.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOut {
    /// The (unscaled) global norm fed in.
    pub norm: f64,
    /// The smallest norm this step would have clipped: what a plot draws next
    /// to the norm. `+inf` when nothing could clip (warm-up without a cap).
    pub boundary: f64,
    /// The norm the gradients are clipped to: the coefficient is
    /// `clip_coefficient(norm, threshold, semantics)`. `+inf`: no clipping.
    pub threshold: f64,
    pub coefficient: f64,
    /// `norm > threshold`.
    pub clipped: bool,
    /// ZClip: the z-test (or `percentile` mode's test) fired. AutoClip: same as `clipped`.
    pub spike: bool,
    /// The norm was NaN or infinite: the state was left exactly as it was.
    pub skipped: bool,
    /// Smallest relative distance of a decision from its boundary (see [`margin`]).
    pub margin: f64,
}

// ---------------------------------------------------------------------------
// ZClip

/// ZClip's `mode`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ZMode {
    /// `mode="zscore"`: clip when `z = (g - μ) / (σ + eps) > z_thresh`.
    ZScore(ZClipTo),
    /// `mode="percentile"` (a misnomer kept from the reference): clip to
    /// `μ + z_thresh · σ` when `g` exceeds it.
    Percentile,
}

/// ZClip's `clip_option` in z-score mode: what a spike is clipped to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ZClipTo {
    /// `"adaptive_scaling"` (default): `(μ + z_thresh · σ / (z / z_thresh)) · clip_factor`.
    AdaptiveScaling,
    /// `"mean"`: `μ`.
    Mean,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZClipConfig {
    pub alpha: f64,
    pub z_thresh: f64,
    pub eps: f64,
    /// Norms collected before the EMA starts (at least 1).
    pub warmup_steps: usize,
    pub mode: ZMode,
    pub clip_factor: f64,
    /// `max_grad_norm`: a fixed cap on top of the adaptive threshold, and the
    /// plain clip applied during warm-up. `None` in gradclip's default (the
    /// reference's README says `None`, its constructor says `1.0`).
    pub max_norm: Option<f64>,
    /// Leave the EMA alone on a spike (the reference updates it with the
    /// clipped value by default).
    pub skip_update_on_spike: bool,
    pub semantics: Semantics,
}

impl Default for ZClipConfig {
    /// The reference's defaults (`alpha=0.97, z_thresh=2.5, eps=1e-6,
    /// warmup_steps=25, mode="zscore", clip_option="adaptive_scaling",
    /// clip_factor=1.0, skip_update_on_spike=False`), without the cap.
    fn default() -> Self {
        Self {
            alpha: 0.97,
            z_thresh: 2.5,
            eps: 1e-6,
            warmup_steps: 25,
            mode: ZMode::ZScore(ZClipTo::AdaptiveScaling),
            clip_factor: 1.0,
            max_norm: None,
            skip_update_on_spike: false,
            semantics: Semantics::Torch,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ZClipState {
    /// Finite warm-up norms seen so far (emptied when the EMA starts).
    pub warmup: Vec<f64>,
    /// `(mean, variance)` once warm-up is over.
    pub ema: Option<(f64, f64)>,
    /// Finite steps seen.
    pub steps: u64,
}

pub struct ZClip {
    pub cfg: ZClipConfig,
    pub state: ZClipState,
}

impl ZClip {
    pub fn new(cfg: ZClipConfig) -> Self {
        assert!(
            cfg.warmup_steps >= 1,
            "ZClip needs at least one warm-up step"
        );
        Self {
            cfg,
            state: ZClipState {
                warmup: Vec::new(),
                ema: None,
                steps: 0,
            },
        }
    }

    fn cap(&self) -> f64 {
        self.cfg.max_norm.unwrap_or(f64::INFINITY)
    }

    /// The detection boundary in norm units and what a spike is clipped to,
    /// for a norm `g` against the current EMA; `None` during warm-up.
    fn test(&self, g: f64) -> Option<(f64, Option<f64>, f64)> {
        let (mean, var) = self.state.ema?;
        let c = &self.cfg;
        let std = var.sqrt();
        Some(match c.mode {
            ZMode::ZScore(to) => {
                let z = (g - mean) / (std + c.eps);
                let boundary = mean + c.z_thresh * (std + c.eps);
                let clip_to = (z > c.z_thresh).then(|| match to {
                    ZClipTo::AdaptiveScaling => {
                        let eta = z / c.z_thresh;
                        (mean + (c.z_thresh * std) / eta) * c.clip_factor
                    }
                    ZClipTo::Mean => mean,
                });
                (boundary, clip_to, margin(z, c.z_thresh))
            }
            ZMode::Percentile => {
                let threshold = mean + c.z_thresh * std;
                let clip_to = (g > threshold).then_some(threshold);
                (threshold, clip_to, margin(g, threshold))
            }
        })
    }

    pub fn step(&mut self, g: f64) -> StepOut {
        let cap = self.cap();
        let semantics = self.cfg.semantics;
        if !g.is_finite() {
            let boundary = self.test(0.0).map_or(cap, |(b, _, _)| b.min(cap));
            return StepOut {
                norm: g,
                boundary,
                threshold: cap,
                coefficient: clip_coefficient(g, cap, semantics),
                clipped: false,
                spike: false,
                skipped: true,
                margin: f64::INFINITY,
            };
        }
        self.state.steps += 1;
        let Some((boundary, clip_to, z_margin)) = self.test(g) else {
            // Warm-up: collect, start the EMA on the last warm-up step, clip
            // only by the cap (torch's clip_grad_norm_ in the reference).
            self.state.warmup.push(g);
            if self.state.warmup.len() >= self.cfg.warmup_steps {
                let n = self.state.warmup.len() as f64;
                let mean = self.state.warmup.iter().sum::<f64>() / n;
                let var = self
                    .state
                    .warmup
                    .iter()
                    .map(|x| (x - mean) * (x - mean))
                    .sum::<f64>()
                    / n;
                self.state.ema = Some((mean, var));
                self.state.warmup.clear();
            }
            return StepOut {
                norm: g,
                boundary: cap,
                threshold: cap,
                coefficient: clip_coefficient(g, cap, semantics),
                clipped: g > cap,
                spike: false,
                skipped: false,
                margin: margin(g, cap),
            };
        };
        let threshold = clip_to.unwrap_or(f64::INFINITY).min(cap);
        let spike = clip_to.is_some();
        if !(spike && self.cfg.skip_update_on_spike) {
            // The EMA sees the adaptive clip value (before the cap) on a spike.
            let x = clip_to.unwrap_or(g);
            let a = self.cfg.alpha;
            let (mean, var) = self.state.ema.unwrap();
            let mean = a * mean + (1.0 - a) * x;
            let var = a * var + (1.0 - a) * (x - mean) * (x - mean);
            self.state.ema = Some((mean, var));
        }
        StepOut {
            norm: g,
            boundary: boundary.min(cap),
            threshold,
            coefficient: clip_coefficient(g, threshold, semantics),
            clipped: g > threshold,
            spike,
            skipped: false,
            margin: z_margin.min(margin(g, cap)),
        }
    }
}

// ---------------------------------------------------------------------------
// AutoClip

/// numpy's default `np.percentile(a, p)` (`method="linear"`, Hyndman & Fan
/// type 7; also `torch.quantile`'s default): with the values sorted,
/// `h = (n - 1) · (p / 100)`, `x[⌊h⌋] + (h - ⌊h⌋) · (x[⌊h⌋ + 1] - x[⌊h⌋])`.
/// `p` in [0, 100]; `values` finite and not empty.
pub fn percentile_linear(values: &[f64], p: f64) -> f64 {
    assert!(!values.is_empty(), "percentile of nothing");
    assert!(
        (0.0..=100.0).contains(&p),
        "percentile {p} outside [0, 100]"
    );
    let mut x = values.to_vec();
    x.sort_by(|a, b| a.partial_cmp(b).expect("finite values"));
    let h = (x.len() - 1) as f64 * (p / 100.0);
    let lo = h.floor() as usize;
    let frac = h - lo as f64;
    if lo + 1 >= x.len() {
        return x[lo];
    }
    x[lo] + frac * (x[lo + 1] - x[lo])
}

/// The histogram variant proposed for AutoClip over all of history (see
/// docs/adaptive.md): each norm, as f32, is replaced by the lower edge of its
/// bucket (the f32 bits with all but `mantissa_bits` mantissa bits cleared),
/// then [`percentile_linear`]. Truncation is monotone, so for normal floats
/// the result is below the exact percentile of the f32 values by at most a
/// relative `2^-mantissa_bits`.
pub fn percentile_bucketed(values: &[f64], p: f64, mantissa_bits: u32) -> f64 {
    assert!(mantissa_bits <= 23);
    let drop = 23 - mantissa_bits;
    let floored: Vec<f64> = values
        .iter()
        .map(|&v| {
            let bits = (v as f32).to_bits();
            f32::from_bits(bits >> drop << drop) as f64
        })
        .collect();
    percentile_linear(&floored, p)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoClipConfig {
    /// The percentile, in [0, 100].
    pub percentile: f64,
    /// Keep only the last `window` norms; `None`: all of history (the paper).
    pub window: Option<usize>,
    /// Add this step's norm to the history before taking the percentile (the
    /// paper's code, `autoclip.py`); `false`: the package's `QuantileClip`,
    /// whose first step does not clip.
    pub include_current: bool,
    pub semantics: Semantics,
}

impl AutoClipConfig {
    /// The paper's algorithm: all of history, this step included.
    pub fn paper(percentile: f64) -> Self {
        Self {
            percentile,
            window: None,
            include_current: true,
            semantics: Semantics::Torch,
        }
    }
}

pub struct AutoClip {
    pub cfg: AutoClipConfig,
    /// Oldest first.
    pub history: Vec<f64>,
    pub steps: u64,
}

impl AutoClip {
    pub fn new(cfg: AutoClipConfig) -> Self {
        assert!((0.0..=100.0).contains(&cfg.percentile));
        assert!(cfg.window != Some(0), "an empty window");
        Self {
            cfg,
            history: Vec::new(),
            steps: 0,
        }
    }

    fn push(&mut self, g: f64) {
        self.history.push(g);
        if let Some(w) = self.cfg.window {
            if self.history.len() > w {
                self.history.remove(0);
            }
        }
    }

    fn current(&self) -> f64 {
        if self.history.is_empty() {
            f64::INFINITY
        } else {
            percentile_linear(&self.history, self.cfg.percentile)
        }
    }

    pub fn step(&mut self, g: f64) -> StepOut {
        let semantics = self.cfg.semantics;
        if !g.is_finite() {
            let threshold = self.current();
            return StepOut {
                norm: g,
                boundary: threshold,
                threshold,
                coefficient: clip_coefficient(g, threshold, semantics),
                clipped: false,
                spike: false,
                skipped: true,
                margin: f64::INFINITY,
            };
        }
        self.steps += 1;
        let threshold = if self.cfg.include_current {
            self.push(g);
            self.current()
        } else {
            let t = self.current();
            self.push(g);
            t
        };
        let clipped = g > threshold;
        StepOut {
            norm: g,
            boundary: threshold,
            threshold,
            coefficient: clip_coefficient(g, threshold, semantics),
            clipped,
            spike: clipped,
            skipped: false,
            // A threshold that is this step's own norm (selected, not
            // interpolated) is the same float on both sides: no knife edge.
            margin: if threshold == g {
                f64::INFINITY
            } else {
                margin(g, threshold)
            },
        }
    }
}

// ---------------------------------------------------------------------------
// AdaGC

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaGcConfig {
    /// Global clip threshold during warm-up (Megatron's `--clip-grad`).
    pub lambda_abs: f64,
    /// Relative threshold: tensor `i` is clipped to `lambda_rel · γ_i`.
    pub lambda_rel: f64,
    /// EMA factor of `γ_i`.
    pub beta: f64,
    /// Steps of global clipping first (`start_clip_steps`); 0: none.
    pub warmup_steps: u64,
    pub semantics: Semantics,
}

impl Default for AdaGcConfig {
    /// The authors' code (`AdaGC(clip_ratio=1.04, beta=0.99,
    /// start_clip_steps=100)` with `--clip-grad 1.0`).
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

/// One tensor in one AdaGC step.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorOut {
    pub norm: f64,
    /// What this tensor is clipped to: `lambda_rel · γ` after warm-up; during
    /// warm-up the global `lambda_abs` (compared with the global norm).
    pub threshold: f64,
    pub coefficient: f64,
    pub clipped: bool,
    pub margin: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AdaGcStep {
    pub total_norm: f64,
    pub warmup: bool,
    pub skipped: bool,
    pub tensors: Vec<TensorOut>,
}

pub struct AdaGc {
    pub cfg: AdaGcConfig,
    /// `γ_i`; `None` until the tensor's first finite step.
    pub gamma: Vec<Option<f64>>,
    /// Finite steps seen.
    pub steps: u64,
}

impl AdaGc {
    pub fn new(cfg: AdaGcConfig, tensors: usize) -> Self {
        Self {
            cfg,
            gamma: vec![None; tensors],
            steps: 0,
        }
    }

    /// `norms[i]`: the unscaled norm of tensor `i` this step.
    pub fn step(&mut self, norms: &[f64]) -> AdaGcStep {
        assert_eq!(norms.len(), self.gamma.len(), "one norm per tensor");
        let c = self.cfg;
        let total = norms.iter().map(|n| n * n).sum::<f64>().sqrt();
        let finite = norms.iter().all(|n| n.is_finite());
        // Only finite steps count, so a skipped step keeps its phase.
        if self.steps < c.warmup_steps {
            let coefficient = clip_coefficient(total, c.lambda_abs, c.semantics);
            let tensors = norms
                .iter()
                .map(|&norm| TensorOut {
                    norm,
                    threshold: c.lambda_abs,
                    coefficient,
                    clipped: total > c.lambda_abs,
                    margin: margin(total, c.lambda_abs),
                })
                .collect();
            if finite {
                self.steps += 1;
                // Each tensor's norm after the global clip; γ keeps the smallest.
                for (gamma, &n) in self.gamma.iter_mut().zip(norms) {
                    let clipped_norm = coefficient * n;
                    *gamma = Some(gamma.map_or(clipped_norm, |g| g.min(clipped_norm)));
                }
            }
            return AdaGcStep {
                total_norm: total,
                warmup: true,
                skipped: !finite,
                tensors,
            };
        }
        let mut tensors = Vec::with_capacity(norms.len());
        let mut next = self.gamma.clone();
        for (gamma, &n) in next.iter_mut().zip(norms) {
            // The authors' code starts γ at the tensor's first norm when
            // there was no warm-up.
            let g0 = gamma.unwrap_or(if n.is_finite() { n } else { f64::INFINITY });
            let threshold = c.lambda_rel * g0;
            let clipped = n > threshold;
            tensors.push(TensorOut {
                norm: n,
                threshold,
                coefficient: clip_coefficient(n, threshold, c.semantics),
                clipped,
                margin: margin(n, threshold),
            });
            let seen = if clipped { threshold } else { n };
            *gamma = Some(c.beta * g0 + (1.0 - c.beta) * seen);
        }
        if finite {
            self.steps += 1;
            self.gamma = next;
        }
        AdaGcStep {
            total_norm: total,
            warmup: false,
            skipped: !finite,
            tensors,
        }
    }
}

// ---------------------------------------------------------------------------
// AGC

/// A row-major tensor of f32 values.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: &[usize], data: Vec<f32>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape and data"
        );
        Self {
            shape: shape.to_vec(),
            data,
        }
    }
}

/// Which axes a unit's norm reduces over.
#[derive(Clone, Debug, PartialEq)]
pub enum Units {
    /// Optax `unitwise_norm(x, axis=None)` (and the NFNets code): a tensor
    /// that squeezes to rank ≤ 1 is one unit; rank 2 and 3 (JAX `IO`,
    /// multi-head linear) reduce over axis 0; rank 4 (`HWIO`) over 0, 1, 2.
    Optax,
    /// PyTorch layouts (`OI`, `OIHW`), as timm's `agc.py`: rank ≤ 1 is one
    /// unit, otherwise one unit per index of axis 0 (a row).
    Torch,
    /// Optax's `axis=` argument: these axes, sorted.
    Axes(Vec<usize>),
}

/// The axes a unit reduces over, or why the shape has no default.
pub fn unit_axes(shape: &[usize], units: &Units) -> Result<Vec<usize>, String> {
    let rank = shape.len();
    match units {
        Units::Optax => {
            let squeezed = shape.iter().filter(|&&d| d != 1).count();
            if squeezed <= 1 {
                Ok((0..rank).collect())
            } else if rank == 2 || rank == 3 {
                Ok(vec![0])
            } else if rank == 4 {
                Ok(vec![0, 1, 2])
            } else {
                Err(format!("Optax has no default unit for shape {shape:?}"))
            }
        }
        Units::Torch => Ok(if rank <= 1 {
            (0..rank).collect()
        } else {
            (1..rank).collect()
        }),
        Units::Axes(axes) => {
            let mut a = axes.clone();
            a.sort_unstable();
            a.dedup();
            if a.iter().any(|&x| x >= rank) {
                return Err(format!("axes {axes:?} outside rank {rank}"));
            }
            Ok(a)
        }
    }
}

/// A tensor seen as `[P, R, Q]` in row-major order, each unit being the `R`
/// elements `(p, 0..R, q)` at stride `Q`: the form the GPU proposal uses. It
/// exists when the reduced axes are one contiguous run (every default above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitView {
    pub p: usize,
    pub r: usize,
    pub q: usize,
}

impl UnitView {
    pub fn of(shape: &[usize], axes: &[usize]) -> Option<Self> {
        let n: usize = shape.iter().product();
        if axes.is_empty() {
            // Every element its own unit.
            return Some(Self { p: n, r: 1, q: 1 });
        }
        let (a, b) = (axes[0], axes[axes.len() - 1] + 1);
        if axes.len() != b - a {
            return None;
        }
        Some(Self {
            p: shape[..a].iter().product(),
            r: shape[a..b].iter().product(),
            q: shape[b..].iter().product(),
        })
    }

    pub fn units(&self) -> usize {
        self.p * self.q
    }

    /// The unit of element `e` (row-major flat index).
    pub fn unit_of(&self, e: usize) -> usize {
        (e / (self.r * self.q)) * self.q + e % self.q
    }
}

/// One unit's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitOut {
    pub grad_norm: f64,
    pub param_norm: f64,
    /// `clipping · max(param_norm, eps)`.
    pub max_norm: f64,
    /// What the unit's gradients are multiplied by (1: unchanged).
    pub factor: f64,
    pub clipped: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AgcOut {
    pub grad: Vec<f64>,
    pub units: Vec<UnitOut>,
}

/// `jnp.maximum`: NaN if either is NaN (Rust's `f64::max` drops NaN).
fn jnp_maximum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Optax's `unitwise_clip` on one unit's norms.
fn unit_clip(grad_norm: f64, param_norm: f64, clipping: f64, eps: f64) -> UnitOut {
    let max_norm = clipping * jnp_maximum(param_norm, eps);
    // `jnp.where(g_norm < max_norm, grad, grad * (max_norm / max(g_norm, 1e-6)))`
    let keep = grad_norm < max_norm;
    let factor = if keep {
        1.0
    } else {
        max_norm / jnp_maximum(grad_norm, 1e-6)
    };
    UnitOut {
        grad_norm,
        param_norm,
        max_norm,
        factor,
        clipped: !keep,
    }
}

fn apply(grad: &Tensor, units: &[UnitOut], unit_of: impl Fn(usize) -> usize) -> Vec<f64> {
    grad.data
        .iter()
        .enumerate()
        .map(|(e, &g)| {
            let u = &units[unit_of(e)];
            if u.clipped {
                g as f64 * u.factor
            } else {
                g as f64
            }
        })
        .collect()
}

/// Optax `adaptive_grad_clip(clipping, eps)` on one parameter, transcribed
/// from its formula with the reduced axes handled in general (any axes, not
/// only a contiguous run): `unitwise_norm` of the gradient and the
/// parameter, `max_norm = clipping · max(p_norm, eps)`, and the gradient kept
/// where `g_norm < max_norm`, else `g · max_norm / max(g_norm, 1e-6)`.
/// Units are numbered by the kept axes in row-major order.
pub fn agc_optax(grad: &Tensor, param: &Tensor, clipping: f64, eps: f64, axes: &[usize]) -> AgcOut {
    assert_eq!(grad.shape, param.shape, "gradient and parameter shapes");
    let shape = &grad.shape;
    let rank = shape.len();
    let reduced = |d: usize| axes.contains(&d);
    // Strides of the kept axes in the unit numbering.
    let mut unit_stride = vec![0usize; rank];
    let mut units = 1usize;
    for d in (0..rank).rev() {
        if !reduced(d) {
            unit_stride[d] = units;
            units *= shape[d];
        }
    }
    let unit_of = |mut e: usize| {
        let mut u = 0;
        for d in (0..rank).rev() {
            let i = e % shape[d];
            e /= shape[d];
            u += i * unit_stride[d];
        }
        u
    };
    let mut g2 = vec![0.0f64; units];
    let mut p2 = vec![0.0f64; units];
    for e in 0..grad.data.len() {
        let u = unit_of(e);
        g2[u] += (grad.data[e] as f64).powi(2);
        p2[u] += (param.data[e] as f64).powi(2);
    }
    let outs: Vec<UnitOut> = (0..units)
        .map(|u| unit_clip(g2[u].sqrt(), p2[u].sqrt(), clipping, eps))
        .collect();
    AgcOut {
        grad: apply(grad, &outs, unit_of),
        units: outs,
    }
}

/// The same clip through a [`UnitView`]: units numbered `p · Q + q`, each
/// unit's elements summed in increasing flat index (the order
/// [`agc_optax`] sums them in, so the two agree bit for bit).
pub fn agc_view(grad: &Tensor, param: &Tensor, clipping: f64, eps: f64, view: UnitView) -> AgcOut {
    assert_eq!(grad.shape, param.shape, "gradient and parameter shapes");
    assert_eq!(view.p * view.r * view.q, grad.data.len(), "view and size");
    let mut outs = Vec::with_capacity(view.units());
    for p in 0..view.p {
        for q in 0..view.q {
            let (mut g2, mut p2) = (0.0f64, 0.0f64);
            for r in 0..view.r {
                let e = (p * view.r + r) * view.q + q;
                g2 += (grad.data[e] as f64).powi(2);
                p2 += (param.data[e] as f64).powi(2);
            }
            outs.push(unit_clip(g2.sqrt(), p2.sqrt(), clipping, eps));
        }
    }
    AgcOut {
        grad: apply(grad, &outs, |e| view.unit_of(e)),
        units: outs,
    }
}

// ---------------------------------------------------------------------------
// Deterministic generators

/// SplitMix64 (Steele, Lea & Flood 2014): a few lines, no dependency, the
/// same bits on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Approximately standard normal: the sum of 12 uniforms minus 6 (mean 0,
    /// variance 1, bounded by ±6), arithmetic only so every platform agrees.
    pub fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.uniform()).sum::<f64>() - 6.0
    }
}

/// Steps of the synthetic sequences.
pub const SYNTH_STEPS: usize = 500;
/// The step (0-based) whose norm is NaN.
pub const NAN_STEP: usize = 250;
/// `(step, factor)`: steps whose norm is the drifting level times `factor`.
/// Step 40 falls in AdaGC's warm-up, 120 and 121 are back to back.
pub const SPIKES: [(usize, f64); 6] = [
    (40, 6.0),
    (120, 10.0),
    (121, 4.0),
    (200, 25.0),
    (330, 8.0),
    (460, 15.0),
];
/// The fixed seed of the sequences the GPU tests run.
pub const SYNTH_SEED: u64 = 0x5eed_0001;

/// The drifting level at step `t`: from 2.0 down to 0.8 in a straight line
/// over [`SYNTH_STEPS`] (gradient norms shrink as training goes on).
pub fn drift_level(t: usize) -> f64 {
    2.0 - 1.2 * t as f64 / (SYNTH_STEPS - 1) as f64
}

/// The 500-step global norm sequence: the drifting level times
/// `1 + 0.05 · N(0, 1)`, the [`SPIKES`], and NaN at [`NAN_STEP`].
pub fn synthetic_norms(seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    (0..SYNTH_STEPS)
        .map(|t| {
            let noise = 1.0 + 0.05 * rng.normal();
            let spike = SPIKES
                .iter()
                .find(|(s, _)| *s == t)
                .map_or(1.0, |(_, f)| *f);
            if t == NAN_STEP {
                f64::NAN
            } else {
                drift_level(t) * noise * spike
            }
        })
        .collect()
}

/// Relative scales of the tensors in [`synthetic_tensor_norms`].
pub const TENSOR_SCALES: [f64; 4] = [1.0, 0.3, 0.05, 2.0];
/// `(step, tensor, factor)`: per-tensor spikes; step 200 spikes every tensor.
pub const TENSOR_SPIKES: [(usize, usize, f64); 7] = [
    (121, 0, 4.0),
    (130, 1, 8.0),
    (200, 0, 25.0),
    (200, 1, 25.0),
    (200, 2, 25.0),
    (200, 3, 25.0),
    (330, 3, 5.0),
];
/// The tensor whose norm is NaN at [`NAN_STEP`].
pub const NAN_TENSOR: usize = 2;

/// Per-tensor norms for AdaGC, `[step][tensor]`: each tensor's scale times
/// the drifting level times its own `1 + 0.05 · N(0, 1)` noise, the
/// [`TENSOR_SPIKES`], and NaN in [`NAN_TENSOR`] at [`NAN_STEP`].
pub fn synthetic_tensor_norms(seed: u64) -> Vec<Vec<f64>> {
    let mut rng = Rng::new(seed);
    (0..SYNTH_STEPS)
        .map(|t| {
            (0..TENSOR_SCALES.len())
                .map(|i| {
                    let noise = 1.0 + 0.05 * rng.normal();
                    let spike = TENSOR_SPIKES
                        .iter()
                        .find(|(s, k, _)| *s == t && *k == i)
                        .map_or(1.0, |(_, _, f)| *f);
                    if t == NAN_STEP && i == NAN_TENSOR {
                        f64::NAN
                    } else {
                        TENSOR_SCALES[i] * drift_level(t) * noise * spike
                    }
                })
                .collect()
        })
        .collect()
}

/// `len` f32 gradients in a random direction whose norm is `target` (to
/// float32 rounding: feed the references the float64 norm of the returned
/// data, not `target`). A NaN `target` gives finite values with one NaN, an
/// infinite one a single +inf.
pub fn gradients_with_norm(rng: &mut Rng, len: usize, target: f64) -> Vec<f32> {
    assert!(len > 0);
    let mut v: Vec<f64> = (0..len).map(|_| rng.uniform() * 2.0 - 1.0).collect();
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let k = if target.is_finite() {
        target / norm
    } else {
        1.0
    };
    v.iter_mut().for_each(|x| *x *= k);
    let mut out: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    if !target.is_finite() {
        out[len / 2] = if target.is_nan() {
            f32::NAN
        } else {
            f32::INFINITY
        };
    }
    out
}

/// One AGC test parameter.
#[derive(Clone, Debug)]
pub struct AgcCase {
    pub name: &'static str,
    pub units: Units,
    pub param: Tensor,
    pub grad: Tensor,
}

/// The clipping ratio the AGC cases are built around.
pub const AGC_CLIPPING: f64 = 0.05;
/// Optax's default `eps`.
pub const AGC_EPS: f64 = 1e-3;

/// Weights and gradients for AGC: a bias, a `[1, n]` row that squeezes to a
/// vector, a JAX dense `IO`, a multi-head `[H, I, O]`, a conv `HWIO`, and
/// PyTorch's `OI` and `OIHW`. In every tensor with several units, unit 0 has
/// all-zero weights (so `eps` sets its limit) and the last unit an all-zero
/// gradient; the bias has zero weights. The other units' gradient norms are
/// `ratio · clipping · ‖w‖` with `ratio` uniform in [0.2, 3), so most clip
/// and some do not.
pub fn agc_cases(seed: u64) -> Vec<AgcCase> {
    let mut rng = Rng::new(seed);
    let specs: [(&str, &[usize], Units); 7] = [
        ("bias", &[6], Units::Optax),
        ("row_1xn", &[1, 5], Units::Optax),
        ("dense_io", &[4, 3], Units::Optax),
        ("multihead_hio", &[2, 3, 4], Units::Optax),
        ("conv_hwio", &[3, 3, 2, 4], Units::Optax),
        ("dense_oi_torch", &[3, 4], Units::Torch),
        ("conv_oihw_torch", &[4, 2, 3, 3], Units::Torch),
    ];
    specs
        .into_iter()
        .map(|(name, shape, units)| {
            let n: usize = shape.iter().product();
            let axes = unit_axes(shape, &units).expect("default axes");
            let view = UnitView::of(shape, &axes).expect("contiguous axes");
            let mut param: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let mut grad: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
            let count = view.units();
            for u in 0..count {
                let elems: Vec<usize> = (0..n).filter(|&e| view.unit_of(e) == u).collect();
                if u == 0 && (count > 1 || name == "bias") {
                    elems.iter().for_each(|&e| param[e] = 0.0);
                }
                if count > 1 && u == count - 1 {
                    elems.iter().for_each(|&e| grad[e] = 0.0);
                    continue;
                }
                let w = elems
                    .iter()
                    .map(|&e| (param[e] as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
                    .max(AGC_EPS);
                let g = elems.iter().map(|&e| grad[e] * grad[e]).sum::<f64>().sqrt();
                let ratio = 0.2 + 2.8 * rng.uniform();
                let k = ratio * AGC_CLIPPING * w / g;
                elems.iter().for_each(|&e| grad[e] *= k);
            }
            AgcCase {
                name,
                units,
                param: Tensor::new(shape, param),
                grad: Tensor::new(shape, grad.iter().map(|&x| x as f32).collect()),
            }
        })
        .collect()
}
