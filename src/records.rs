//! Host mirrors of the records declared in `shaders/common.wgsl`. Their byte
//! layouts and the constants below are read back from the WGSL with naga in
//! the test suite (`tests/native/shaders.rs`), so a change on one side that is not
//! made on the other fails a test.

use bytemuck::{Pod, Zeroable};

/// WGSL `Chunk`: one tensor's slice, cut at the chunk length and at windows
/// (three words of the plan table).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Chunk {
    /// First element, counted from the start of the chunk's binding window.
    pub start: u32,
    pub len: u32,
    pub tensor: u32,
}

/// WGSL `Partial`: a reduction of some elements that combines exactly with
/// others (see [`NormPartial`](crate::NormPartial) for its public face).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Partial {
    pub v: [f32; 3],
    pub flags: u32,
}

/// WGSL `TensorStat`: a tensor's norm and its coefficient, exactly, as
/// `coef_mant * 2^coef_exp` (the coefficient may be far below `f32::MIN_POSITIVE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct TensorStat {
    pub norm: f32,
    pub coef_mant: f32,
    pub coef_exp: i32,
    pub _pad: u32,
}

/// WGSL `WindowInfo`: written once per binding window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct WindowInfo {
    pub chunk_begin: u32,
    pub chunk_end: u32,
    pub chunk_count: u32,
    pub workgroups: u32,
    pub tensor_count: u32,
    pub flat_begin: u32,
    pub flat_end: u32,
    pub flat_count: u32,
    pub flat_workgroups: u32,
    /// Word index of the per-tensor partial ranges in the plan table.
    pub ranges_at: u32,
    /// Word index of the flat chunks' gaps in the plan table.
    pub gaps_at: u32,
    /// Tensors of the statistics pass: those of the plan table's split list
    /// (after the gaps), or every tensor where the list is not there
    /// (`Plan::split`).
    pub split_count: u32,
    /// Word index of the flat chunks' unit runs in the plan table (after
    /// the split and long lists; only where some tensor is fused,
    /// `Plan::units`).
    pub units_at: u32,
    /// Tensors of the statistics pass's workgroups: those of the plan
    /// table's long list, after the split list (`Plan::long`).
    pub long_count: u32,
}

/// WGSL `ClipConfig`: one clip's parameters, copied into the set's config
/// uniform by the clip's own commands.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct ClipConfig {
    pub semantics: u32,
    pub p: f32,
    pub max_norm: f32,
    /// `CFG_*` bits.
    pub flags: u32,
    pub clamp_min: f32,
    pub clamp_max: f32,
    /// Low 32 bits of the step number the host gave this clip.
    pub step: u32,
    pub _pad: u32,
    /// The total a clip with `CFG_SUPPLIED` uses instead of reducing.
    pub supplied: Partial,
}

/// WGSL `ClipState`: the result finalize leaves on the GPU, and the loss
/// scale it keeps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct ClipState {
    pub total_norm: f32,
    /// Factor applied to the stored gradients (clip coefficient / S when
    /// unscaling), rounded to an f32: 0 or subnormal when the exact factor
    /// is below the normal range; `coef_mant * 2^coef_exp` is exact.
    pub coefficient: f32,
    pub nonfinite: u32,
    /// How the scale pass treats each element: one of the `CLIP_SCALE_*` constants.
    pub scale_kind: u32,
    pub dispatch: [u32; 3],
    /// 1 when an unscaling clip found a NaN or inf: gradients untouched, skip the step.
    pub found_inf: u32,
    /// The loss scale for the next backward pass.
    pub loss_scale: f32,
    /// The loss scale this clip divided by (1 when it did not unscale).
    pub unscaled_by: f32,
    pub growth_tracker: u32,
    /// Low 32 bits of the step that wrote this state.
    pub step: u32,
    pub coef_mant: f32,
    pub coef_exp: i32,
    /// The `CFG_*` bits of the clip that wrote this state.
    pub flags: u32,
    /// The `max_norm` (TensorFlow's `clip_norm`) this clip used: for an
    /// adaptive clip, the threshold its GPU pass chose.
    pub max_norm: f32,
}

/// WGSL `LogEntry`: one step's state and total partial, as kept in the
/// report log.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct LogEntry {
    pub state: ClipState,
    pub partial: Partial,
}

/// WGSL `ScalerConfig`: GradScaler's update parameters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct ScalerConfig {
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u32,
    pub _pad: u32,
}

/// Entries of the report log (WGSL `LOG_LEN`): the last this many steps'
/// reports stay on the GPU until read.
pub const LOG_LEN: u64 = 64;

/// Byte offsets of the members of WGSL
/// `Stats { state, partial, scaler, tensors_step, tensors_clipped, log, tensors }`.
pub const STATS_STATE_OFFSET: u64 = 0;
pub const STATS_PARTIAL_OFFSET: u64 = 64;
pub const STATS_SCALER_OFFSET: u64 = 80;
/// Low 32 bits of the step whose per-tensor results `tensors` holds.
pub const STATS_TENSORS_STEP_OFFSET: u64 = 96;
/// The latest step in which a tensor's factor was not 1 (GPU-only).
pub const STATS_TENSORS_CLIPPED_OFFSET: u64 = 100;
pub const STATS_LOG_OFFSET: u64 = 112;
pub const STATS_TENSORS_OFFSET: u64 = STATS_LOG_OFFSET + LOG_LEN * 80;
/// Bytes of `Stats` up to its per-tensor array.
pub const STATS_HEAD_SIZE: u64 = STATS_TENSORS_OFFSET;

/// Byte offset of the `supplied` partial inside `ClipConfig`.
pub const CONFIG_SUPPLIED_OFFSET: u64 = core::mem::offset_of!(ClipConfig, supplied) as u64;
/// Byte offset of the scale pass's indirect arguments inside `ClipState`.
pub const DISPATCH_OFFSET: u64 = core::mem::offset_of!(ClipState, dispatch) as u64;
/// Byte size of one indirect dispatch (x, y, z).
pub const DISPATCH_SIZE: u64 = 12;

/// Values of WGSL's `SEMANTICS_*` constants.
pub const SEMANTICS_TORCH: u32 = 0;
pub const SEMANTICS_TENSORFLOW: u32 = 1;
/// Bits of WGSL's `FLAG_*` constants in `ClipState::nonfinite` and `Partial::flags`.
pub const FLAG_INF: u32 = 1;
pub const FLAG_NAN: u32 = 2;
/// A supplied partial holds bits no reduction produces (only in `ClipState::nonfinite`).
pub const FLAG_INVALID: u32 = 4;
/// Bits of WGSL's `CFG_*` constants in `ClipConfig::flags`.
pub const CFG_TENSOR_NORMS: u32 = 1;
pub const CFG_PER_TENSOR: u32 = 2;
pub const CFG_NO_SCALE: u32 = 4;
pub const CFG_UNSCALE: u32 = 8;
pub const CFG_ERROR_IF_NONFINITE: u32 = 16;
pub const CFG_SUPPLIED: u32 = 32;
pub const CFG_KEEP_SCALE: u32 = 64;

/// `ClipState.scale_kind` values, the WGSL constants of the same names in
/// [`crate::wgsl::CLIP_STATE`], by which the scale pass and `clip_apply`
/// treat each element: times the exact factor; PyTorch's inf norm (finite
/// elements to signed zeros, the others NaN); all NaN (a NaN norm, or
/// TensorFlow's non-finite one); each tensor by its own factor.
pub const CLIP_SCALE_MULTIPLY: u32 = 0;
pub const CLIP_SCALE_ZERO_FINITE: u32 = 1;
pub const CLIP_SCALE_ALL_NAN: u32 = 2;
pub const CLIP_SCALE_PER_TENSOR: u32 = 3;

/// Values of AGC's `DTYPE` override ([`crate::shaders::AGC_DTYPE_OVERRIDE`]),
/// the WGSL constants of the same names in `shaders/adaptive_agc.wgsl`.
pub const AGC_DTYPE_F32: u32 = 0;
pub const AGC_DTYPE_F16: u32 = 1;
pub const AGC_DTYPE_BF16: u32 = 2;

/// `AdaptiveParams.method` and `AdaptiveState.method` of each adaptive
/// method (`shaders/adaptive_records.wgsl`, which both adaptive modules
/// include; AdaGC's module has its own pass).
pub const METHOD_ZCLIP: u32 = 1;
pub const METHOD_AUTOCLIP: u32 = 2;
pub const METHOD_ADAGC: u32 = 3;

/// `AdaptiveParams.flags` bits: ZClip's cap, mode, clip target and
/// skip-on-spike, AutoClip's order and histogram, AdaGC's semantics
/// (`shaders/adaptive_records.wgsl`).
pub const P_HAS_CAP: u32 = 1;
pub const P_PERCENTILE_MODE: u32 = 2;
pub const P_CLIP_TO_MEAN: u32 = 4;
pub const P_SKIP_ON_SPIKE: u32 = 8;
pub const P_INCLUDE_CURRENT: u32 = 16;
pub const P_TENSORFLOW: u32 = 32;
pub const P_HISTOGRAM: u32 = 64;

/// `AdaptiveState.decision` bits, in both adaptive modules (AdaGC's has no spike).
pub const D_CLIPPED: u32 = 1;
pub const D_SPIKE: u32 = 2;
pub const D_SKIPPED: u32 = 4;
pub const D_WARMUP: u32 = 8;

/// The `DTYPE` override of AGC's pipelines for gradients and parameters of `dtype`.
pub fn agc_dtype(dtype: crate::GradType) -> u32 {
    match dtype {
        crate::GradType::F32 => AGC_DTYPE_F32,
        crate::GradType::F16 => AGC_DTYPE_F16,
        crate::GradType::Bf16 => AGC_DTYPE_BF16,
    }
}

/// A record's WGSL struct name, byte size and `(member, offset)` pairs.
pub type RecordLayout = (&'static str, usize, Vec<(&'static str, usize)>);

/// The layout of every record the host shares with the shaders, for the
/// layout check in the test suite.
pub fn layouts() -> Vec<RecordLayout> {
    use core::mem::{offset_of, size_of};
    macro_rules! record {
        ($t:ident { $($f:ident),* }) => {
            (stringify!($t), size_of::<$t>(), vec![$((stringify!($f), offset_of!($t, $f))),*])
        };
    }
    vec![
        record!(Partial { v, flags }),
        record!(WindowInfo {
            chunk_begin,
            chunk_end,
            chunk_count,
            workgroups,
            tensor_count,
            flat_begin,
            flat_end,
            flat_count,
            flat_workgroups,
            ranges_at,
            gaps_at,
            split_count,
            units_at,
            long_count
        }),
        record!(ClipConfig {
            semantics,
            p,
            max_norm,
            flags,
            clamp_min,
            clamp_max,
            step,
            _pad,
            supplied
        }),
        record!(TensorStat {
            norm,
            coef_mant,
            coef_exp,
            _pad
        }),
        record!(ClipState {
            total_norm,
            coefficient,
            nonfinite,
            scale_kind,
            dispatch,
            found_inf,
            loss_scale,
            unscaled_by,
            growth_tracker,
            step,
            coef_mant,
            coef_exp,
            flags,
            max_norm
        }),
        record!(LogEntry { state, partial }),
        record!(ScalerConfig {
            growth_factor,
            backoff_factor,
            growth_interval,
            _pad
        }),
    ]
}
