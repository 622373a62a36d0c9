// The records and bits of the adaptive passes (ZClip and AutoClip in
// adaptive.wgsl, AdaGC in adaptive_adagc.wgsl): both modules include this
// file, after clip_state.wgsl and bits.wgsl, so that the state the host
// saves and restores as bytes has one declaration (gradclip::records holds
// the host's side, checked against this one by the tests).

// AdaptiveParams.method and AdaptiveState.method.
const METHOD_ZCLIP: u32 = 1u;
const METHOD_AUTOCLIP: u32 = 2u;
const METHOD_ADAGC: u32 = 3u;

// AdaptiveParams.flags bits
const P_HAS_CAP: u32 = 1u;          // ZClip: a fixed max_norm caps the threshold
const P_PERCENTILE_MODE: u32 = 2u;  // ZClip: mode = "percentile" (clip to mean + z·std)
const P_CLIP_TO_MEAN: u32 = 4u;     // ZClip: clip_option = "mean"
const P_SKIP_ON_SPIKE: u32 = 8u;    // ZClip: skip_update_on_spike
const P_INCLUDE_CURRENT: u32 = 16u; // AutoClip: the step's norm joins the history first
const P_TENSORFLOW: u32 = 32u;      // AdaGC: TensorFlow's clip_by_norm factor, not PyTorch's
const P_HISTOGRAM: u32 = 64u;       // AutoClip: all of history as bucket counts

// AdaptiveState.decision bits (AdaGC sets no spike).
const D_CLIPPED: u32 = 1u;
const D_SPIKE: u32 = 2u;
const D_SKIPPED: u32 = 4u;
const D_WARMUP: u32 = 8u;

// Written once by the host when the adaptive clip is made.
struct AdaptiveParams {
    method: u32,
    warmup: u32,    // ZClip: norms collected before the EMA starts; AdaGC: steps of global clipping first
    capacity: u32,  // words of AdaptiveState.history
    flags: u32,     // P_*
    alpha: f32,     // ZClip's EMA factor; AdaGC's beta, the EMA factor of γ
    z_thresh: f32,
    eps: f32,
    clip_factor: f32,
    cap: f32,        // ZClip's max_norm when P_HAS_CAP; AdaGC's lambda_abs, the warm-up's threshold
    percentile: f32, // AutoClip, in [0, 100]
    tensors: u32,    // AdaGC: tensors of the set
    ratio: f32,      // AdaGC's lambda_rel: tensor i is clipped to ratio · γ_i
    scale_workgroups: u32, // AdaGC: the set's per-tensor grid-stride workgroups
    bucket_shift: u32, // AutoClip with P_HISTOGRAM: mantissa bits a bucket drops
    _pad2: vec2<u32>,
}

// Everything the method carries from step to step, and the latest decision.
// Saved and restored as bytes by the host.
struct AdaptiveState {
    method: u32,    // METHOD_*, checked by the host on restore
    capacity: u32,  // checked on restore
    steps: u32,     // finite steps folded in (low 32 bits)
    count: u32,     // ZClip: warm-up norms collected; AutoClip: norms in the window (or counted)
    head: u32,      // AutoClip: the ring slot the next norm goes to
    ema_ready: u32, // ZClip: the warm-up is over
    mean: f32,
    variance: f32,
    // The latest step:
    norm: f32,       // the norm the pass read (that of the set's record_norm)
    threshold: f32,  // what the gradients are clipped to; +inf: no clipping
    boundary: f32,   // the smallest norm this step would have clipped; +inf: none
    decision: u32,   // D_*
    max_norm: f32,   // threshold as the clip's max_norm (F32_MAX for +inf)
    recorded: u32,   // adaptive steps run, skipped ones included (low 32 bits)
    _pad: vec2<u32>,
    // As bits: f32 norms (ZClip's warm-up, AutoClip's window ring), or
    // AutoClip's bucket counts with P_HISTOGRAM, or AdaGC's four f32 per
    // tensor (γ or -1 before its first finite step, norm, threshold, factor).
    history: array<u32>,
}
