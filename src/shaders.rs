//! The WGSL sources. Each pass is one shader module made of
//! `shaders/common.wgsl` followed by its own files; the test suite validates
//! every module with naga, translates it for each backend and reads its
//! workgroup size and record layouts back to check them against the host.

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

const COMMON: (&str, &str) = ("common.wgsl", include_str!("../shaders/common.wgsl"));
const FOLD: (&str, &str) = ("fold.wgsl", include_str!("../shaders/fold.wgsl"));

/// Reduce: per-chunk partial norms.
pub const REDUCE: PassModule = PassModule {
    name: "gradclip reduce",
    files: &[
        COMMON,
        FOLD,
        ("reduce.wgsl", include_str!("../shaders/reduce.wgsl")),
    ],
    entry_points: &["reduce_l2", "reduce_inf", "reduce_p"],
};

/// Finalize: total norm, per-tensor norms, coefficient, scale dispatch;
/// finish: the same from a total supplied by the host.
pub const FINALIZE: PassModule = PassModule {
    name: "gradclip finalize",
    files: &[
        COMMON,
        FOLD,
        ("finalize.wgsl", include_str!("../shaders/finalize.wgsl")),
    ],
    entry_points: &[
        "finalize_l2",
        "finalize_inf",
        "finalize_p",
        "finish_l2",
        "finish_inf",
        "finish_p",
    ],
};

/// Scale: in-place multiply (norm clipping) and clamp (value clipping).
pub const SCALE: PassModule = PassModule {
    name: "gradclip scale",
    files: &[
        COMMON,
        ("scale.wgsl", include_str!("../shaders/scale.wgsl")),
    ],
    entry_points: &["scale", "clamp_values"],
};

/// Every pass module.
pub const MODULES: [PassModule; 3] = [REDUCE, FINALIZE, SCALE];

/// Name of the pipeline-overridable constant that sets the workgroup size.
pub const WORKGROUP_SIZE_OVERRIDE: &str = "WG";
