//! The WGSL sources. Each pass is one shader module made of
//! `shaders/common.wgsl` followed by its own files; the test suite validates
//! every module with naga, translates it for each backend and reads its
//! workgroup size and record layouts back to check them against the host.
//!
//! The reduce and scale passes exist once per [`ElementPath`]: the same pass
//! file composed with an element file (`elem_*.wgsl`) that declares the
//! gradients binding and decodes / encodes its elements.

use crate::dtype::ElementPath;

/// A shader module of one pass: the files it is made of, in order, and the
/// entry points the host uses from it.
#[derive(Clone, Copy, Debug)]
pub struct PassModule {
    /// Label of the module and of the pipelines made from it.
    pub name: &'static str,
    /// `(file name, contents)` of each source file, concatenated in order.
    pub files: &'static [(&'static str, &'static str)],
    /// Entry points the host creates pipelines for.
    pub entry_points: &'static [&'static str],
    /// Whether the module needs `wgpu::Features::SHADER_F16` (`enable f16;`).
    pub shader_f16: bool,
}

impl PassModule {
    /// The module's WGSL source.
    pub fn source(&self) -> String {
        self.files
            .iter()
            .map(|(_, text)| *text)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `shaders/division.wgsl`: f32 division of mantissas rounded as IEEE 754
/// rounds it, which WGSL's `/` is not held to. It needs `bits.wgsl`'s
/// constants before it. Public so that tests can drive its correction with
/// estimates a driver might return.
pub const ROUNDED_DIVISION: &str = include_str!("../shaders/division.wgsl");

const CLIP_STATE: (&str, &str) = ("clip_state.wgsl", crate::wgsl::CLIP_STATE);
/// `shaders/bits.wgsl`: the f32 bit patterns (masks, constants) the passes
/// test on integer bits, which [`ROUNDED_DIVISION`] needs before it.
pub const F32_BITS: &str = include_str!("../shaders/bits.wgsl");
const BITS: (&str, &str) = ("bits.wgsl", F32_BITS);
const COMMON: (&str, &str) = ("common.wgsl", include_str!("../shaders/common.wgsl"));
const FOLD: (&str, &str) = ("fold.wgsl", include_str!("../shaders/fold.wgsl"));
const DIVISION: (&str, &str) = ("division.wgsl", ROUNDED_DIVISION);
const COEFFICIENT: (&str, &str) = (
    "coefficient.wgsl",
    include_str!("../shaders/coefficient.wgsl"),
);
const HALF: (&str, &str) = ("half.wgsl", include_str!("../shaders/half.wgsl"));
/// The adaptive passes' records and bits, one declaration for both modules.
const ADAPTIVE_RECORDS: (&str, &str) = (
    "adaptive_records.wgsl",
    include_str!("../shaders/adaptive_records.wgsl"),
);
const REDUCE_FILE: (&str, &str) = ("reduce.wgsl", include_str!("../shaders/reduce.wgsl"));
const SCALE_FILE: (&str, &str) = ("scale.wgsl", include_str!("../shaders/scale.wgsl"));
const ELEM_F32: (&str, &str) = ("elem_f32.wgsl", include_str!("../shaders/elem_f32.wgsl"));
const ELEM_F32_UNALIGNED: (&str, &str) = (
    "elem_f32_unaligned.wgsl",
    include_str!("../shaders/elem_f32_unaligned.wgsl"),
);
/// Starts with `enable f16;`, so it comes first in its modules.
const ELEM_F16: (&str, &str) = ("elem_f16.wgsl", include_str!("../shaders/elem_f16.wgsl"));
/// f16 and bf16 as u32 words: one element file, after the format's file.
const ELEM_PACKED16: (&str, &str) = (
    "elem_packed16.wgsl",
    include_str!("../shaders/elem_packed16.wgsl"),
);
const PACKED16_F16: (&str, &str) = (
    "packed16_f16.wgsl",
    include_str!("../shaders/packed16_f16.wgsl"),
);
const PACKED16_BF16: (&str, &str) = (
    "packed16_bf16.wgsl",
    include_str!("../shaders/packed16_bf16.wgsl"),
);

const REDUCE_ENTRY_POINTS: &[&str] = &["reduce", "reduce_tensors"];
const SCALE_ENTRY_POINTS: &[&str] = &["scale", "clamp_values"];

/// Reduce: per-chunk partial norms, and the per-tensor results of fused
/// tensors (f32 gradients).
pub const REDUCE: PassModule = PassModule {
    name: "gradclip reduce",
    files: &[
        CLIP_STATE,
        BITS,
        COMMON,
        ELEM_F32,
        FOLD,
        DIVISION,
        COEFFICIENT,
        REDUCE_FILE,
    ],
    entry_points: REDUCE_ENTRY_POINTS,
    shader_f16: false,
};

/// Finalize: total norm, clip factor, scale dispatch, loss-scale update,
/// report log; finish_supplied: the same from a supplied total;
/// tensor_stats: the per-tensor norms and factors of the tensors the
/// reduce pass does not fuse, spread over the device.
pub const FINALIZE: PassModule = PassModule {
    name: "gradclip finalize",
    files: &[
        CLIP_STATE,
        BITS,
        COMMON,
        FOLD,
        DIVISION,
        COEFFICIENT,
        ("finalize.wgsl", include_str!("../shaders/finalize.wgsl")),
    ],
    entry_points: &[
        "finalize",
        "finish_supplied",
        "long_tensor_stats",
        "tensor_stats",
    ],
    shader_f16: false,
};

/// Scale: in-place multiply (norm clipping) and clamp (value clipping), f32 gradients.
pub const SCALE: PassModule = PassModule {
    name: "gradclip scale",
    files: &[CLIP_STATE, BITS, COMMON, ELEM_F32, SCALE_FILE],
    entry_points: SCALE_ENTRY_POINTS,
    shader_f16: false,
};

/// Reduce over f32 gradients whose window ends on no 16-byte boundary
/// ([`ElementPath::F32Unaligned`]).
pub const REDUCE_F32_UNALIGNED: PassModule = PassModule {
    name: "gradclip reduce f32 unaligned",
    files: &[
        CLIP_STATE,
        BITS,
        COMMON,
        ELEM_F32_UNALIGNED,
        FOLD,
        DIVISION,
        COEFFICIENT,
        REDUCE_FILE,
    ],
    entry_points: REDUCE_ENTRY_POINTS,
    shader_f16: false,
};

/// Scale over f32 gradients whose window ends on no 16-byte boundary.
pub const SCALE_F32_UNALIGNED: PassModule = PassModule {
    name: "gradclip scale f32 unaligned",
    files: &[CLIP_STATE, BITS, COMMON, ELEM_F32_UNALIGNED, SCALE_FILE],
    entry_points: SCALE_ENTRY_POINTS,
    shader_f16: false,
};

/// Reduce over f16 gradients with native 16-bit loads (`shader-f16`).
pub const REDUCE_F16: PassModule = PassModule {
    name: "gradclip reduce f16",
    files: &[
        ELEM_F16,
        CLIP_STATE,
        BITS,
        COMMON,
        HALF,
        FOLD,
        DIVISION,
        COEFFICIENT,
        REDUCE_FILE,
    ],
    entry_points: REDUCE_ENTRY_POINTS,
    shader_f16: true,
};

/// Scale over f16 gradients with native 16-bit stores (`shader-f16`).
pub const SCALE_F16: PassModule = PassModule {
    name: "gradclip scale f16",
    files: &[ELEM_F16, CLIP_STATE, BITS, COMMON, HALF, SCALE_FILE],
    entry_points: SCALE_ENTRY_POINTS,
    shader_f16: true,
};

/// Reduce over f16 gradients read as pairs from `u32` words.
pub const REDUCE_F16_PACKED: PassModule = PassModule {
    name: "gradclip reduce f16 packed",
    files: &[
        CLIP_STATE,
        BITS,
        COMMON,
        HALF,
        PACKED16_F16,
        ELEM_PACKED16,
        FOLD,
        DIVISION,
        COEFFICIENT,
        REDUCE_FILE,
    ],
    entry_points: REDUCE_ENTRY_POINTS,
    shader_f16: false,
};

/// Scale over f16 gradients written as pairs into `u32` words.
pub const SCALE_F16_PACKED: PassModule = PassModule {
    name: "gradclip scale f16 packed",
    files: &[
        CLIP_STATE,
        BITS,
        COMMON,
        HALF,
        PACKED16_F16,
        ELEM_PACKED16,
        SCALE_FILE,
    ],
    entry_points: SCALE_ENTRY_POINTS,
    shader_f16: false,
};

/// Reduce over bf16 gradients read as pairs from `u32` words.
pub const REDUCE_BF16_PACKED: PassModule = PassModule {
    name: "gradclip reduce bf16 packed",
    files: &[
        CLIP_STATE,
        BITS,
        COMMON,
        HALF,
        PACKED16_BF16,
        ELEM_PACKED16,
        FOLD,
        DIVISION,
        COEFFICIENT,
        REDUCE_FILE,
    ],
    entry_points: REDUCE_ENTRY_POINTS,
    shader_f16: false,
};

/// Scale over bf16 gradients written as pairs into `u32` words.
pub const SCALE_BF16_PACKED: PassModule = PassModule {
    name: "gradclip scale bf16 packed",
    files: &[
        CLIP_STATE,
        BITS,
        COMMON,
        HALF,
        PACKED16_BF16,
        ELEM_PACKED16,
        SCALE_FILE,
    ],
    entry_points: SCALE_ENTRY_POINTS,
    shader_f16: false,
};

/// The adaptive thresholds (ZClip, AutoClip; [`crate::AdaptiveClip`]): a
/// module of its own with its own bind group (the set's `ClipState`, the
/// adaptive state, its parameters), not in [`MODULES`], whose passes all
/// share one layout.
pub const ADAPTIVE: PassModule = PassModule {
    name: "gradclip adaptive",
    files: &[
        CLIP_STATE,
        BITS,
        ADAPTIVE_RECORDS,
        ("adaptive.wgsl", include_str!("../shaders/adaptive.wgsl")),
    ],
    entry_points: &["adaptive_step"],
    shader_f16: false,
};

/// AdaGC's per-tensor thresholds ([`crate::AdaGc`]): its own module and
/// bind group (the set's whole stats, read and written; the adaptive state;
/// the parameters), not in [`MODULES`].
pub const ADAPTIVE_ADAGC: PassModule = PassModule {
    name: "gradclip adaptive adagc",
    files: &[
        CLIP_STATE,
        BITS,
        DIVISION,
        ADAPTIVE_RECORDS,
        (
            "adaptive_adagc.wgsl",
            include_str!("../shaders/adaptive_adagc.wgsl"),
        ),
    ],
    entry_points: &["adagc_step"],
    shader_f16: false,
};

/// AGC's unit-wise clip ([`crate::AgcClip`]): gradients, parameters, the
/// unit table, the per-unit results and the parameters; standalone (no
/// `ClipState`), not in [`MODULES`]. The element type is the
/// [`AGC_DTYPE_OVERRIDE`] override.
pub const ADAPTIVE_AGC: PassModule = PassModule {
    name: "gradclip adaptive agc",
    files: &[
        BITS,
        DIVISION,
        HALF,
        (
            "adaptive_agc.wgsl",
            include_str!("../shaders/adaptive_agc.wgsl"),
        ),
    ],
    entry_points: &["agc_norms", "agc_scale"],
    shader_f16: false,
};

/// Every pass module; the first three are the f32 ones.
pub const MODULES: [PassModule; 11] = [
    REDUCE,
    FINALIZE,
    SCALE,
    REDUCE_F32_UNALIGNED,
    SCALE_F32_UNALIGNED,
    REDUCE_F16,
    SCALE_F16,
    REDUCE_F16_PACKED,
    SCALE_F16_PACKED,
    REDUCE_BF16_PACKED,
    SCALE_BF16_PACKED,
];

/// The reduce and scale modules of one element path.
pub fn element_modules(path: ElementPath) -> (PassModule, PassModule) {
    match path {
        ElementPath::F32 => (REDUCE, SCALE),
        ElementPath::F32Unaligned => (REDUCE_F32_UNALIGNED, SCALE_F32_UNALIGNED),
        ElementPath::F16Native => (REDUCE_F16, SCALE_F16),
        ElementPath::F16Packed => (REDUCE_F16_PACKED, SCALE_F16_PACKED),
        ElementPath::Bf16Packed => (REDUCE_BF16_PACKED, SCALE_BF16_PACKED),
    }
}

/// Name of the pipeline-overridable constant that sets the workgroup size.
pub const WORKGROUP_SIZE_OVERRIDE: &str = "WG";
/// Name of the pipeline-overridable constant that picks the reduction
/// (0 = L2, 1 = Inf, 2 = general p) of the reduce and finalize pipelines.
pub const KIND_OVERRIDE: &str = "KIND";
/// Name of the reduce pass's pipeline-overridable constant that holds the
/// integer p its pipeline is specialised for (1 to [`MAX_POWER`]; 0 for
/// any other p and for L2 and Inf).
pub const POWER_OVERRIDE: &str = "POWER";
/// Name of the reduce pass's pipeline-overridable constant that lets
/// `reduce_tensors` take per-tensor results from the flat walk's own loads
/// where a chunk's segments fit its slots (off for sets whose chunks hold
/// no tensor boundary, which have no use for the tracked walk's code).
pub const TRACK_OVERRIDE: &str = "TRACK";
/// Name of the reduce pass's pipeline-overridable constant that lets
/// `reduce_tensors` give fused tensors (whole tensors shorter than the
/// element-wise fold's run, in a flat chunk of several segments) their
/// norms and factors itself (set for sets that have any: plan::Plan::fuse).
pub const FUSE_OVERRIDE: &str = "FUSE";
/// Name of the reduce pass's pipeline-overridable constant that keeps
/// `reduce_tensors`' paths for segments outside unit runs (off for sets
/// with fused tensors whose every flat chunk of several segments is all
/// unit run: plan::Plan::segments_outside_units).
pub const SEGMENTS_OVERRIDE: &str = "SEGMENTS";
/// Name of the reduce pass's pipeline-overridable constant that keeps
/// `reduce_tensors`' plain and unit walks beside the tracked one (off for
/// sets whose every flat chunk takes the tracked walk:
/// plan::Bound::untracked).
pub const UNTRACKED_OVERRIDE: &str = "UNTRACKED";
/// The reduce pass folds segments shorter than this element by element
/// (WGSL `TINY_RUN`; `CHUNK / MID_MAX` where that is more: 128 elements in
/// CPU adapters' long chunks).
pub const TINY_RUN: u32 = 32;
/// The most medium segments a flat chunk's list holds in the reduce pass
/// (WGSL `MID_MAX`).
pub const MID_MAX: u32 = 1024;

/// WGSL `tiny_run()` for a device whose longest flat chunk (the `CHUNK`
/// override) is `chunk`: segments shorter than this are folded element by
/// element, and those that are whole tensors of a flat chunk of several
/// segments are the fused ones.
pub(crate) fn tiny_run(chunk: u32) -> u32 {
    TINY_RUN.max(chunk / MID_MAX)
}

/// Name of the reduce pass's pipeline-overridable constant that keeps the
/// per-segment fold's lists of medium and long segments (off for sets
/// whose every flat chunk of several segments is tracked:
/// plan::Bound::fold_lists).
pub const FOLD_LISTS_OVERRIDE: &str = "FOLD_LISTS";
/// Words of the tracked walk's per-segment slots in workgroup memory
/// (WGSL `SLOT_WORDS`).
pub const SLOT_WORDS: u32 = 1536;
/// Accumulators (loads in flight) of each invocation's walk (WGSL `LANES`).
pub const LANES: u32 = 4;

/// Words of a general p's slot in the tracked walk: its sum and its
/// largest element's bits (WGSL `P_SLOT_WORDS`).
pub const GENERAL_P_SLOT_WORDS: u32 = 2;

/// Words of one of the tracked walk's slots (WGSL `slot_words()`): a
/// general p's [`GENERAL_P_SLOT_WORDS`], the others' one.
pub(crate) fn slot_words(general_p: bool) -> u32 {
    if general_p {
        GENERAL_P_SLOT_WORDS
    } else {
        1
    }
}

/// WGSL `tracks_segments` and `tracked_round` together, for a pipeline with
/// `TRACK` on: whether `reduce_tensors` folds the
/// segments of a flat chunk of `segments` of them, whose shortest inner one
/// has `gap` elements (plan::Plan::gap), in its flat walk, on a device with
/// these overrides, for slots of `slot_words` words ([`slot_words`]).
pub(crate) fn tracks_chunk(
    segments: u32,
    gap: u32,
    workgroup_size: u32,
    team: u32,
    chunk: u32,
    slot_words: u32,
) -> bool {
    segments > 1
        && segments + workgroup_size / team - 1 <= SLOT_WORDS / (team * slot_words)
        && gap.min(chunk) / (4 * LANES * team) != 0
}

/// Name of the pipeline-overridable constant that sets how many
/// neighbouring invocations read each contiguous piece of a run in turns
/// (`TEAM` in common.wgsl, which has no default: every pipeline of a
/// module that has it gets it from the host).
pub const TEAM_OVERRIDE: &str = "TEAM";
/// `TEAM` on GPUs: a team's loads in one step are 128 contiguous bytes.
pub const GPU_TEAM: u32 = 8;
/// `TEAM` on CPU adapters: each invocation streams a piece of its own,
/// which lavapipe and llvmpipe read 1.5-1.9x faster than pieces read by
/// eight lanes in turns (the reduce pass at 10^7 and 2.5 10^7 elements,
/// docs/bench-cpu-drivers.md); SwiftShader reads both alike.
pub const CPU_TEAM: u32 = 1;
/// Workgroup memory of the reduce pass that does not grow with the
/// workgroup size, in bytes: the lists of a chunk's long and medium
/// segments with their counters (128 + 1024 + 4 words) and the tracked
/// walk's slots (1536 words). The test suite reads the real
/// figure from the shader with naga.
pub const REDUCE_WORKGROUP_FIXED_BYTES: u32 = 4 * (128 + MID_MAX + 4 + SLOT_WORDS);
/// Workgroup memory of the reduce pass per invocation, in bytes: the
/// fold's `vec3<f32>` (a 16-byte stride) and `u32`.
pub const REDUCE_WORKGROUP_BYTES_PER_INVOCATION: u32 = 16 + 4;
/// Tensors one invocation of `tensor_stats` takes before it passes over
/// its queue of those that need the general path (WGSL `STAT_BLOCK`; a
/// bit each in a `u32`, so at most 32). CPU adapters give each
/// invocation several tensors (plan::Bound::tensor_stat_workgroups), so
/// that the queue's one masked pass is spread over them: a whole block
/// on SwiftShader, fewer on other CPU drivers (clipper.rs's
/// `CPU_TENSORS_PER_INVOCATION`).
pub const TENSOR_STAT_BLOCK: u32 = 32;
/// Largest integer p with its own reduce pipeline, whose terms are powered
/// by multiplication: p - 1 multiplies per element beside the general
/// path's log2 and exp2, and one pipeline per p that a program uses
/// (WGSL `MAX_POWER`, to which the reduce shader writes those multiplies
/// out; the test suite reads it with naga).
pub const MAX_POWER: u32 = 8;
/// Name of the pipeline-overridable constant that holds the longest flat
/// chunk of any set on the device, from which the reduce pass sizes its
/// lists of a chunk's segments ([`GradSet::chunk_elements`](crate::GradSet::chunk_elements)).
pub const CHUNK_OVERRIDE: &str = "CHUNK";
/// Flat chunk length on GPUs, and the shortest anywhere: 128 elements per
/// invocation of a 256-wide workgroup, so that 10^7 elements still make a
/// few hundred workgroups.
pub(crate) const MIN_CHUNK_ELEMENTS: u32 = 32768;
/// Longest flat chunk on a CPU adapter (a set's are shorter when it has
/// few elements). Each chunk costs its workgroup a fixed price (its fold,
/// its partial, the walk's start) that these drivers pay in whole
/// microseconds: 4x longer chunks made the reduce of 10^7 elements 20-30%
/// faster on lavapipe and llvmpipe GL and up to ~1.8x on SwiftShader
/// (examples/bench, docs/bench-cpu-drivers.md).
pub(crate) const CPU_CHUNK_ELEMENTS: u32 = 131072;
/// Name of the pipeline-overridable constant that sets the element type of
/// AGC's gradients and parameters ([`crate::records::agc_dtype`]).
pub const AGC_DTYPE_OVERRIDE: &str = "DTYPE";
/// Workgroup size of both AGC entry points (`WG` in `shaders/adaptive_agc.wgsl`):
/// `agc_scale` takes one word per invocation.
pub const AGC_WORKGROUP_SIZE: u32 = 64;
