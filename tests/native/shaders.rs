//! Shader checks that need no GPU: every pass module parses and validates
//! with naga, translates for each backend wgpu has (SPIR-V for Vulkan, MSL
//! for Metal, HLSL for DX12, GLSL for GL), and the values the host relies on
//! (workgroup size override, record layouts, flag constants, entry points)
//! are read from the shader and compared with the Rust side.

use gradclip::records;
use gradclip::shaders::{
    PassModule, ADAPTIVE, ADAPTIVE_ADAGC, ADAPTIVE_AGC, AGC_DTYPE_OVERRIDE, AGC_WORKGROUP_SIZE,
    CHUNK_OVERRIDE, CPU_TEAM, FINALIZE, GENERAL_P_SLOT_WORDS, GPU_TEAM, KIND_OVERRIDE, LANES,
    MAX_POWER, MID_MAX, MODULES, POWER_OVERRIDE, REDUCE, REDUCE_WORKGROUP_BYTES_PER_INVOCATION,
    REDUCE_WORKGROUP_FIXED_BYTES, SLOT_WORDS, TEAM_OVERRIDE, TENSOR_STAT_BLOCK, TINY_RUN,
    WORKGROUP_SIZE_OVERRIDE,
};

/// The adaptive methods' modules: no overrides, each with its own layout.
const ADAPTIVE_MODULES: [PassModule; 3] = [ADAPTIVE, ADAPTIVE_ADAGC, ADAPTIVE_AGC];
use naga::back::{glsl, hlsl, msl, spv};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};

fn parse(pass: &PassModule) -> (naga::Module, ModuleInfo) {
    let source = pass.source();
    let module = naga::front::wgsl::parse_str(&source)
        .unwrap_or_else(|e| panic!("{}: {}", pass.name, e.emit_to_string(&source)));
    // The native f16 modules need shader-f16, which wgpu maps to this capability.
    let capabilities = if pass.shader_f16 {
        Capabilities::SHADER_FLOAT16
    } else {
        Capabilities::empty()
    };
    let info = Validator::new(ValidationFlags::all(), capabilities)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}", pass.name, e.emit_to_string(&source)));
    (module, info)
}

/// The module with `WG` and `KIND` set, as the host does when it creates pipelines.
fn specialised(pass: &PassModule, wg: u32, entry: &str) -> (naga::Module, ModuleInfo) {
    specialised_kind(pass, wg, entry, 0, 0)
}

/// The module's override `name`, if it declares one.
fn override_of<'m>(module: &'m naga::Module, name: &str) -> Option<&'m naga::Override> {
    module
        .overrides
        .iter()
        .map(|(_, o)| o)
        .find(|o| o.name.as_deref() == Some(name))
}

/// Whether the module declares the override `name` (naga rejects values
/// for overrides a module does not have, as WebGPU does).
fn has_override(module: &naga::Module, name: &str) -> bool {
    override_of(module, name).is_some()
}

/// `specialised` for reduction `kind` and, in modules that have it, the
/// reduce's integer `power` (0: none).
fn specialised_kind(
    pass: &PassModule,
    wg: u32,
    entry: &str,
    kind: u32,
    power: u32,
) -> (naga::Module, ModuleInfo) {
    let (module, info) = parse(pass);
    // The host's chunk sizes and teams: 32768 and GPU_TEAM beside GPU
    // workgroups, 131072 and CPU_TEAM beside CPU ones.
    let (chunk, team) = if wg >= 256 {
        (32768, GPU_TEAM)
    } else {
        (131072, CPU_TEAM)
    };
    let mut constants: naga::back::PipelineConstants = [
        (WORKGROUP_SIZE_OVERRIDE.to_string(), wg as f64),
        (KIND_OVERRIDE.to_string(), kind as f64),
        (CHUNK_OVERRIDE.to_string(), chunk as f64),
        (TEAM_OVERRIDE.to_string(), team as f64),
    ]
    .into_iter()
    .collect();
    if has_override(&module, POWER_OVERRIDE) {
        constants.insert(POWER_OVERRIDE.to_string(), power as f64);
    }
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, entry)),
        &constants,
    )
    .unwrap_or_else(|e| panic!("{}: {entry}: overrides: {e}", pass.name));
    (module.into_owned(), info.into_owned())
}

#[test]
fn every_module_validates_and_lists_exactly_its_entry_points() {
    for pass in MODULES {
        let (module, _) = parse(&pass);
        let mut found: Vec<&str> = module
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        let mut listed = pass.entry_points.to_vec();
        found.sort();
        listed.sort();
        assert_eq!(found, listed, "{}: entry points", pass.name);
        for ep in &module.entry_points {
            assert_eq!(
                ep.stage,
                naga::ShaderStage::Compute,
                "{}: {}",
                pass.name,
                ep.name
            );
        }
    }
}

#[test]
fn exactly_the_reduce_modules_declare_the_power_override() {
    // The host passes POWER to reduce pipelines only: a value for an
    // override that a module lacks is an error in naga and in WebGPU.
    for pass in MODULES {
        let (module, _) = parse(&pass);
        assert_eq!(
            has_override(&module, POWER_OVERRIDE),
            pass.entry_points.contains(&"reduce"),
            "{}",
            pass.name
        );
    }
}

#[test]
fn every_pass_module_takes_the_hosts_sizes_and_team_has_no_default() {
    // The host passes WG, CHUNK and TEAM to every pipeline of these modules
    // (naga and WebGPU reject a value for an override a module lacks), and
    // TEAM has no default in the shader, so no module can run with a team
    // the host did not pick.
    for pass in MODULES {
        let (module, _) = parse(&pass);
        for name in [WORKGROUP_SIZE_OVERRIDE, CHUNK_OVERRIDE, TEAM_OVERRIDE] {
            assert!(has_override(&module, name), "{}: {name}", pass.name);
        }
        let team = override_of(&module, TEAM_OVERRIDE).unwrap();
        assert!(team.init.is_none(), "{}: TEAM has a default", pass.name);
    }
}

/// A module's entry point as each backend wgpu has takes it.
struct Translations {
    spirv: Vec<u32>,
    msl: String,
    hlsl: String,
    /// None for a module that needs shader-f16, which wgpu's GL backend lacks.
    glsl: Option<String>,
}

/// Translates `entry` of a validated, specialised module to SPIR-V, MSL,
/// HLSL and GLSL ES 3.1, panicking with `what` and the backend on failure.
fn translate(
    module: &naga::Module,
    info: &ModuleInfo,
    entry: &str,
    shader_f16: bool,
    what: &str,
) -> Translations {
    let spv_pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.to_string(),
    };
    let spirv = spv::write_vec(module, info, &spv::Options::default(), Some(&spv_pipeline))
        .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));

    let msl_pipeline = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
        ..Default::default()
    };
    let (msl, _) = msl::write_string(module, info, &msl::Options::default(), &msl_pipeline)
        .unwrap_or_else(|e| panic!("{what}: MSL: {e}"));

    // 16-bit types need shader model 6.2 in HLSL; wgpu's DX12 backend
    // only offers SHADER_F16 where DXC provides it.
    let hlsl_options = if shader_f16 {
        hlsl::Options {
            shader_model: hlsl::ShaderModel::V6_2,
            ..Default::default()
        }
    } else {
        hlsl::Options::default()
    };
    let hlsl_pipeline = hlsl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
    };
    let mut hlsl = String::new();
    hlsl::Writer::new(&mut hlsl, &hlsl_options, &hlsl_pipeline)
        .write(module, info, None)
        .unwrap_or_else(|e| panic!("{what}: HLSL: {e}"));

    let glsl = (!shader_f16).then(|| {
        let glsl_options = glsl::Options {
            version: glsl::Version::Embedded {
                version: 310,
                is_webgl: false,
            },
            ..Default::default()
        };
        let glsl_pipeline = glsl::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.to_string(),
            multiview: None,
        };
        let mut out = String::new();
        glsl::Writer::new(
            &mut out,
            module,
            info,
            &glsl_options,
            &glsl_pipeline,
            naga::proc::BoundsCheckPolicies::default(),
        )
        .and_then(|mut w| w.write())
        .unwrap_or_else(|e| panic!("{what}: GLSL: {e}"));
        out
    });
    Translations {
        spirv,
        msl,
        hlsl,
        glsl,
    }
}

#[test]
fn every_entry_point_translates_for_every_backend() {
    for pass in MODULES {
        // KIND 2 also with the reduce's largest integer power.
        let kinds = [(0, 0), (1, 0), (2, 0), (2, MAX_POWER)];
        for (&entry, (kind, power)) in pass
            .entry_points
            .iter()
            .flat_map(|e| kinds.map(move |k| (e, k)))
        {
            let (module, info) = specialised_kind(&pass, 256, entry, kind, power);
            let what = format!("{} / {entry} / KIND={kind} POWER={power}", pass.name);

            let out = translate(&module, &info, entry, pass.shader_f16, &what);
            assert_eq!(out.spirv[0], 0x0723_0203, "{what}: SPIR-V magic");
            assert!(out.msl.contains("kernel"), "{what}: MSL has a kernel");
            assert!(
                out.hlsl.contains("[numthreads(256, 1, 1)]"),
                "{what}: HLSL numthreads"
            );
            // wgpu's GL backend has no shader-f16: GL devices take the
            // packed modules, which are translated to GLSL like the rest.
            if let Some(glsl) = out.glsl {
                assert!(
                    glsl.contains("local_size_x = 256"),
                    "{what}: GLSL local size"
                );
            }
        }
    }
}

#[test]
fn workgroup_size_comes_from_the_host_override() {
    // Every entry point's size is the override, and injecting it sets it:
    // the host never repeats the number.
    for pass in MODULES {
        for &entry in pass.entry_points {
            for wg in [32, 64, 256] {
                let (module, _) = specialised(&pass, wg, entry);
                let ep = module
                    .entry_points
                    .iter()
                    .find(|e| e.name == entry)
                    .unwrap();
                assert_eq!(
                    ep.workgroup_size,
                    [wg, 1, 1],
                    "{} / {entry} with WG={wg}",
                    pass.name
                );
            }
        }
    }
}

/// Bytes of workgroup memory that entry point `entry` of a specialised
/// module uses, by naga's layout of its workgroup variables.
fn workgroup_bytes(module: &naga::Module, info: &ModuleInfo, entry: &str) -> u32 {
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).unwrap();
    let index = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .unwrap();
    let uses = info.get_entry_point(index);
    module
        .global_variables
        .iter()
        .filter(|&(h, g)| g.space == naga::AddressSpace::WorkGroup && !uses[h].is_empty())
        .map(|(_, g)| layouter[g.ty].size)
        .sum()
}

#[test]
fn workgroup_memory_is_what_the_host_budgets() {
    // The host sizes workgroups from the device's workgroup memory with
    // these two figures; the per-tensor reduce takes exactly them, and no
    // other pass more.
    let budget =
        |wg: u32| REDUCE_WORKGROUP_FIXED_BYTES + REDUCE_WORKGROUP_BYTES_PER_INVOCATION * wg;
    for pass in MODULES {
        for &entry in pass.entry_points {
            for wg in [32, 64, 128, 256] {
                let (module, info) = specialised(&pass, wg, entry);
                let used = workgroup_bytes(&module, &info, entry);
                if entry == "reduce_tensors" {
                    assert_eq!(used, budget(wg), "{} / {entry} with WG={wg}", pass.name);
                } else {
                    assert!(
                        used <= budget(wg),
                        "{} / {entry} with WG={wg}: {used} bytes",
                        pass.name
                    );
                }
            }
        }
    }
    // WebGPU's default limit holds the largest workgroup the host picks.
    assert!(budget(256) <= 16384, "{} bytes", budget(256));
}

/// Size and member offsets of a WGSL struct, by name, from naga's layouter.
fn wgsl_struct(module: &naga::Module, name: &str) -> (u32, Vec<(String, u32)>) {
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).expect("layout");
    let (handle, ty) = module
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no WGSL struct {name}"));
    let naga::TypeInner::Struct { members, span } = &ty.inner else {
        panic!("{name} is not a struct")
    };
    // A struct ending in a runtime array has no fixed size to compare.
    if layouter[handle].size != 0 {
        assert_eq!(*span, layouter[handle].size, "{name}: span");
    }
    (
        *span,
        members
            .iter()
            .map(|m| (m.name.clone().unwrap_or_default(), m.offset))
            .collect(),
    )
}

fn array_stride(module: &naga::Module, ty: naga::Handle<naga::Type>) -> u32 {
    match module.types[ty].inner {
        naga::TypeInner::Array { stride, .. } => stride,
        ref other => panic!("{other:?} is not an array"),
    }
}

#[test]
fn record_layouts_match_the_rust_mirrors() {
    let (module, _) = parse(&MODULES[0]);
    for (name, size, fields) in records::layouts() {
        let (wgsl_size, wgsl_fields) = wgsl_struct(&module, name);
        assert_eq!(wgsl_size as usize, size, "{name}: size");
        let rust: Vec<(String, u32)> = fields
            .iter()
            .map(|(n, o)| (n.to_string(), *o as u32))
            .collect();
        assert_eq!(wgsl_fields, rust, "{name}: members and offsets");
    }
    assert_eq!(
        records::DISPATCH_OFFSET,
        core::mem::offset_of!(records::ClipState, dispatch) as u64
    );
    // Stats ends in a runtime array, so it has no Rust mirror: its member
    // offsets are the host's constants.
    let (_, stats) = wgsl_struct(&module, "Stats");
    let offsets: Vec<(String, u64)> = stats.into_iter().map(|(n, o)| (n, o as u64)).collect();
    let want: Vec<(String, u64)> = [
        ("state", records::STATS_STATE_OFFSET),
        ("partial", records::STATS_PARTIAL_OFFSET),
        ("scaler", records::STATS_SCALER_OFFSET),
        ("tensors_step", records::STATS_TENSORS_STEP_OFFSET),
        ("tensors_clipped", records::STATS_TENSORS_CLIPPED_OFFSET),
        ("log", records::STATS_LOG_OFFSET),
        ("tensors", records::STATS_TENSORS_OFFSET),
    ]
    .iter()
    .map(|(n, o)| (n.to_string(), *o))
    .collect();
    assert_eq!(offsets, want, "Stats members");
    // The partials and the per-tensor statistics are arrays of vec4s (one
    // store each), with the stride of their records.
    let partials = module
        .global_variables
        .iter()
        .find(|(_, v)| v.name.as_deref() == Some("partials"))
        .expect("a partials binding")
        .1
        .ty;
    assert_eq!(
        array_stride(&module, partials) as usize,
        size_of::<records::Partial>()
    );
    let stats = module
        .types
        .iter()
        .find_map(|(_, t)| match &t.inner {
            naga::TypeInner::Struct { members, .. } if t.name.as_deref() == Some("Stats") => {
                members.last().map(|m| m.ty)
            }
            _ => None,
        })
        .expect("Stats ends in the tensors' array");
    assert_eq!(
        array_stride(&module, stats) as usize,
        size_of::<records::TensorStat>()
    );
    assert_eq!(records::STATS_HEAD_SIZE, records::STATS_TENSORS_OFFSET);
    assert_eq!(
        records::CONFIG_SUPPLIED_OFFSET,
        core::mem::offset_of!(records::ClipConfig, supplied) as u64
    );
}

#[test]
fn every_element_path_has_modules_with_the_same_entry_points() {
    use gradclip::shaders::element_modules;
    use gradclip::ElementPath::*;
    for path in [F32, F32Unaligned, F16Native, F16Packed, Bf16Packed] {
        let (reduce, scale) = element_modules(path);
        assert_eq!(reduce.entry_points, MODULES[0].entry_points, "{path:?}");
        assert_eq!(scale.entry_points, MODULES[2].entry_points, "{path:?}");
        assert_eq!(reduce.shader_f16, path == F16Native);
        assert_eq!(scale.shader_f16, path == F16Native);
        for module in [reduce, scale] {
            assert!(
                MODULES.iter().any(|m| m.name == module.name),
                "{} is not in MODULES, so it is not checked",
                module.name
            );
            if module.shader_f16 {
                // WGSL wants `enable f16;` before every declaration.
                assert!(
                    module.source().starts_with("enable f16;"),
                    "{}",
                    module.name
                );
            }
        }
    }
}

fn u32_constant(module: &naga::Module, name: &str) -> u32 {
    let (_, c) = module
        .constants
        .iter()
        .find(|(_, c)| c.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no WGSL constant {name}"));
    match module.global_expressions[c.init] {
        naga::Expression::Literal(naga::Literal::U32(v)) => v,
        ref other => panic!("{name}: not a u32 literal: {other:?}"),
    }
}

/// Each `(name, value)`: the WGSL constant `name` of `module` is `value`.
fn assert_constants(module: &naga::Module, what: &str, constants: &[(&str, u32)]) {
    for &(name, value) in constants {
        assert_eq!(u32_constant(module, name), value, "{what}: {name}");
    }
}

#[test]
fn flag_constants_match_the_host() {
    let (module, _) = parse(&MODULES[1]);
    assert_constants(
        &module,
        MODULES[1].name,
        &[
            ("SEMANTICS_TORCH", records::SEMANTICS_TORCH),
            ("SEMANTICS_TENSORFLOW", records::SEMANTICS_TENSORFLOW),
            ("FLAG_INF", records::FLAG_INF),
            ("FLAG_NAN", records::FLAG_NAN),
            ("CFG_TENSOR_NORMS", records::CFG_TENSOR_NORMS),
            ("CFG_PER_TENSOR", records::CFG_PER_TENSOR),
            ("CFG_NO_SCALE", records::CFG_NO_SCALE),
            ("CFG_UNSCALE", records::CFG_UNSCALE),
            ("CFG_ERROR_IF_NONFINITE", records::CFG_ERROR_IF_NONFINITE),
            ("CFG_SUPPLIED", records::CFG_SUPPLIED),
            ("CFG_KEEP_SCALE", records::CFG_KEEP_SCALE),
            ("FLAG_INVALID", records::FLAG_INVALID),
        ],
    );
    assert_eq!(u32_constant(&module, "LOG_LEN") as u64, records::LOG_LEN);
}

/// The host sizes the per-tensor statistics dispatch from the tensors an
/// invocation takes per pass over its queue, which is a bit mask.
#[test]
fn tensor_stat_block_is_the_hosts() {
    let (module, _) = parse(&FINALIZE);
    assert_eq!(u32_constant(&module, "STAT_BLOCK"), TENSOR_STAT_BLOCK);
    assert!((1..=32).contains(&TENSOR_STAT_BLOCK));
}

/// The host gives integer p up to MAX_POWER a reduce pipeline of their
/// own, whose term_base multiplies are written out up to the shader's
/// MAX_POWER.
#[test]
fn max_power_is_the_hosts() {
    let (module, _) = parse(&REDUCE);
    assert_eq!(u32_constant(&module, "MAX_POWER"), MAX_POWER);
}

/// The host picks the tensors that the reduce pass gives their results
/// (plan::Plan::fused) by the reduce pass's tiny run, from the same
/// constants.
#[test]
fn tiny_run_and_tracking_are_the_hosts() {
    let (module, _) = parse(&REDUCE);
    assert_eq!(u32_constant(&module, "TINY_RUN"), TINY_RUN);
    assert_eq!(u32_constant(&module, "MID_MAX"), MID_MAX);
    // And which chunks the tracked walk takes (shaders::tracks_chunk, for
    // the pipelines' FOLD_LISTS), from the tracked walk's constants.
    assert_eq!(u32_constant(&module, "SLOT_WORDS"), SLOT_WORDS);
    assert_eq!(u32_constant(&module, "LANES"), LANES);
    assert_eq!(u32_constant(&module, "P_SLOT_WORDS"), GENERAL_P_SLOT_WORDS);
}

#[test]
fn adaptive_constants_match_the_host() {
    let decisions = [
        ("D_CLIPPED", records::D_CLIPPED),
        ("D_SKIPPED", records::D_SKIPPED),
        ("D_WARMUP", records::D_WARMUP),
    ];
    let (module, _) = parse(&ADAPTIVE);
    assert_constants(&module, ADAPTIVE.name, &decisions);
    assert_constants(
        &module,
        ADAPTIVE.name,
        &[
            ("D_SPIKE", records::D_SPIKE),
            ("METHOD_ZCLIP", records::METHOD_ZCLIP),
            ("METHOD_AUTOCLIP", records::METHOD_AUTOCLIP),
            ("P_HAS_CAP", records::P_HAS_CAP),
            ("P_PERCENTILE_MODE", records::P_PERCENTILE_MODE),
            ("P_CLIP_TO_MEAN", records::P_CLIP_TO_MEAN),
            ("P_SKIP_ON_SPIKE", records::P_SKIP_ON_SPIKE),
            ("P_INCLUDE_CURRENT", records::P_INCLUDE_CURRENT),
            ("P_HISTOGRAM", records::P_HISTOGRAM),
            ("P_TENSORFLOW", records::P_TENSORFLOW),
            ("METHOD_ADAGC", records::METHOD_ADAGC),
        ],
    );
    let (module, _) = parse(&ADAPTIVE_ADAGC);
    assert_constants(&module, ADAPTIVE_ADAGC.name, &decisions);
    assert_constants(
        &module,
        ADAPTIVE_ADAGC.name,
        &[("P_TENSORFLOW", records::P_TENSORFLOW)],
    );
}

/// The scale kinds users' shaders read from `ClipState` (the exported
/// text, parsed on its own, as they paste it) are the host's.
#[test]
fn scale_kinds_match_the_host() {
    let module =
        naga::front::wgsl::parse_str(gradclip::wgsl::CLIP_STATE).expect("CLIP_STATE parses alone");
    assert_constants(
        &module,
        "gradclip::wgsl::CLIP_STATE",
        &[
            ("CLIP_SCALE_MULTIPLY", records::CLIP_SCALE_MULTIPLY),
            ("CLIP_SCALE_ZERO_FINITE", records::CLIP_SCALE_ZERO_FINITE),
            ("CLIP_SCALE_ALL_NAN", records::CLIP_SCALE_ALL_NAN),
            ("CLIP_SCALE_PER_TENSOR", records::CLIP_SCALE_PER_TENSOR),
        ],
    );
}

#[test]
fn agc_element_types_and_workgroup_size_match_the_host() {
    let (module, _) = parse(&ADAPTIVE_AGC);
    assert_constants(
        &module,
        ADAPTIVE_AGC.name,
        &[
            ("AGC_DTYPE_F32", records::AGC_DTYPE_F32),
            ("AGC_DTYPE_F16", records::AGC_DTYPE_F16),
            ("AGC_DTYPE_BF16", records::AGC_DTYPE_BF16),
        ],
    );
    assert!(has_override(&module, AGC_DTYPE_OVERRIDE));
    // agc_scale's dispatch divides the words by this size.
    for ep in &module.entry_points {
        assert_eq!(ep.workgroup_size, [AGC_WORKGROUP_SIZE, 1, 1], "{}", ep.name);
    }
}

#[test]
fn the_exported_clip_state_is_what_every_module_starts_with() {
    // Users paste gradclip::wgsl::CLIP_STATE into their own shaders; it
    // validates alone, declares clip_apply, and is the text of our modules'
    // ClipState (so its layout is the one record_layouts_match checks).
    let text = gradclip::wgsl::CLIP_STATE;
    let user = format!(
        "{text}\n@group(0) @binding(0) var<storage, read> clip: ClipState;\n\
         @group(0) @binding(1) var<storage, read_write> g: array<f32>;\n\
         @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {{\n\
         if id.x < arrayLength(&g) {{ g[id.x] = clip_apply(g[id.x], clip); }} }}"
    );
    let module = naga::front::wgsl::parse_str(&user).expect("user module parses");
    Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .expect("user module validates");
    for pass in MODULES {
        assert!(
            pass.source().contains(text),
            "{} does not include the exported ClipState",
            pass.name
        );
    }
}

#[test]
fn every_entry_point_is_documented() {
    // House rule: a comment right above each entry point says what it reads,
    // what it writes and its dispatch shape.
    for pass in MODULES.into_iter().chain(ADAPTIVE_MODULES) {
        let source = pass.source();
        let lines: Vec<&str> = source.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with("@compute") {
                continue;
            }
            let comment: Vec<&str> = lines[..i]
                .iter()
                .rev()
                .take_while(|l| l.trim_start().starts_with("//"))
                .copied()
                .collect();
            let text = comment.join(" ").to_lowercase();
            for word in ["reads", "writes", "dispatch"] {
                assert!(
                    text.contains(word),
                    "{}: entry point at line {} lacks '{word}' in its comment",
                    pass.name,
                    i + 1
                );
            }
        }
    }
}

#[test]
fn adaptive_modules_validate_and_translate_for_every_backend() {
    for pass in ADAPTIVE_MODULES {
        let (module, info) = parse(&pass);
        let mut found: Vec<&str> = module
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        let mut listed = pass.entry_points.to_vec();
        found.sort();
        listed.sort();
        assert_eq!(found, listed, "{}: entry points", pass.name);
        // AGC once per element type (its DTYPE override); the others have none.
        let overrides: Vec<naga::back::PipelineConstants> = if pass.name == ADAPTIVE_AGC.name {
            [
                records::AGC_DTYPE_F32,
                records::AGC_DTYPE_F16,
                records::AGC_DTYPE_BF16,
            ]
            .map(|d| {
                [(AGC_DTYPE_OVERRIDE.to_string(), d as f64)]
                    .into_iter()
                    .collect()
            })
            .to_vec()
        } else {
            vec![Default::default()]
        };
        for (&entry, constants) in pass
            .entry_points
            .iter()
            .flat_map(|e| overrides.iter().map(move |c| (e, c)))
        {
            let what = format!("{} / {entry} / {constants:?}", pass.name);
            let (module, info) = naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some((naga::ShaderStage::Compute, entry)),
                constants,
            )
            .unwrap_or_else(|e| panic!("{what}: overrides: {e}"));
            let out = translate(&module, &info, entry, pass.shader_f16, &what);
            assert_eq!(out.spirv[0], 0x0723_0203, "{what}: SPIR-V magic");
        }
    }
}
