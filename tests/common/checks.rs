//! What each golden case runs and what it must give, shared by the native
//! suite (`tests/native/golden.rs`) and the browser suite (`tests/web_golden.rs`):
//! only how the clip is run and read back differs between them.

use gradclip::{ClipNorm, ClipReport, Error, GradSet, Norm};

use super::golden::Case;
use super::reference::{self, assert_close, assert_identical, rel_diff};

pub const TOL: f64 = 1e-5;

/// The clip a golden case asks for.
pub enum Op {
    Norm(ClipNorm),
    /// `clip_value(-v, v)`.
    Value(f32),
}

impl Op {
    pub fn of(case: &Case) -> Op {
        match case.kind.as_str() {
            "clip_norm" => Op::Norm(
                ClipNorm::new(case.f64("max_norm") as f32)
                    .norm(norm_of(case))
                    .error_if_nonfinite(
                        case.raw["error_if_nonfinite"]
                            .as_bool()
                            .expect("error_if_nonfinite"),
                    ),
            ),
            "clip_by_global_norm" => Op::Norm(ClipNorm::tensorflow(case.f64("clip_norm") as f32)),
            "clip_value" => Op::Value(case.f64("clip_value") as f32),
            other => panic!("unknown golden kind {other}"),
        }
    }

    pub fn record(
        &self,
        set: &GradSet,
        encoder: &mut wgpu::CommandEncoder,
    ) -> gradclip::Result<()> {
        match self {
            Op::Norm(clip) => set.clip_norm(encoder, clip),
            Op::Value(v) => set.clip_value(encoder, -v, *v),
        }
    }
}

fn norm_of(case: &Case) -> Norm {
    match &case.raw["norm_type"] {
        serde_json::Value::String(s) if s == "inf" => Norm::Inf,
        v => match v.as_f64().expect("norm_type") {
            2.0 => Norm::L2,
            1.0 => Norm::L1,
            p => Norm::P(p as f32),
        },
    }
}

/// Checks what `Op::of(case)` gave: the report of the clip (ignored for value
/// clipping) and the gradients afterwards. Panics with the case name.
pub fn verify(case: &Case, report: gradclip::Result<ClipReport>, clipped: &[f32]) {
    match case.kind.as_str() {
        "clip_norm" => check_clip_norm(case, report, clipped),
        "clip_by_global_norm" => check_tensorflow(case, report, clipped),
        "clip_value" => assert_identical(
            clipped,
            &case.floats("torch_clipped"),
            &format!("{}: clamped", case.name),
        ),
        other => panic!("unknown golden kind {other}"),
    }
}

fn check_clip_norm(case: &Case, report: gradclip::Result<ClipReport>, clipped: &[f32]) {
    let max_norm = case.f64("max_norm");
    let exact = case.f64("exact_total_norm");

    if case.raw["expect_error"].as_str() == Some("nonfinite") {
        match report {
            Err(Error::NonFinite { total_norm }) => {
                assert_eq!(
                    total_norm.is_nan(),
                    exact.is_nan(),
                    "{}: kind of non-finite norm",
                    case.name
                )
            }
            other => panic!("{}: expected Error::NonFinite, got {other:?}", case.name),
        }
        assert_identical(
            clipped,
            &case.grads,
            &format!("{}: gradients untouched", case.name),
        );
        return;
    }

    let report = report.unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let torch = case.torch_total_norm().expect("torch_total_norm") as f64;
    let torch_is_wrong =
        exact.is_finite() && (torch.is_infinite() || (torch == 0.0 && exact > 0.0));
    let target = if torch_is_wrong { exact } else { torch };
    let got = report.total_norm as f64;
    assert!(
        rel_diff(got, target) <= TOL,
        "{}: total norm {got:e}, want {target:e}",
        case.name
    );
    assert!(
        rel_diff(got, exact) <= TOL,
        "{}: total norm {got:e}, exact {exact:e}",
        case.name
    );

    let want = if torch_is_wrong {
        reference::torch_clipped(&case.grads, exact, max_norm)
    } else {
        case.floats("torch_clipped")
    };
    let what = format!("{}: clipped gradients", case.name);
    if report.coefficient == 1.0 || !exact.is_finite() {
        // Nothing scaled, or NaN/inf propagation: PyTorch's result is exact.
        assert_identical(clipped, &want, &what);
    } else {
        assert_close(clipped, &want, TOL, &what);
    }
}

fn check_tensorflow(case: &Case, report: gradclip::Result<ClipReport>, clipped: &[f32]) {
    let report = report.unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let exact = case.f64("exact_total_norm");
    assert!(
        rel_diff(report.total_norm as f64, exact) <= TOL,
        "{}: total norm {}, want {exact:e}",
        case.name,
        report.total_norm
    );
    let want = case.floats("exact_clipped");
    let what = format!("{}: clipped gradients", case.name);
    if exact == 0.0 || !exact.is_finite() {
        assert_identical(clipped, &want, &what);
    } else {
        assert_close(clipped, &want, TOL, &what);
    }
}
