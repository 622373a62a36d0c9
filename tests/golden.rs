//! The 24 golden cases from PyTorch 2.15 and the TensorFlow formula, on the
//! adapter wgpu picks. Where PyTorch's float32 arithmetic overflows or
//! underflows, the exact float64 norm is the target.

mod common;

use common::golden::{cases, Case};
use common::reference::{self, assert_close, assert_identical};
use common::{rel_diff, run_clip};
use gradclip::{ClipNorm, Error, Norm};

const TOL: f64 = 1e-5;

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

fn check_clip_norm(case: &Case) {
    let max_norm = case.f64("max_norm");
    let error_if_nonfinite = case.raw["error_if_nonfinite"]
        .as_bool()
        .expect("error_if_nonfinite");
    let clip = ClipNorm::new(max_norm as f32)
        .norm(norm_of(case))
        .error_if_nonfinite(error_if_nonfinite);
    let (report, clipped) = run_clip(&case.grads, &case.sizes, |set, enc| {
        set.clip_norm(enc, &clip)
    });
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
            &clipped,
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
        assert_identical(&clipped, &want, &what);
    } else {
        assert_close(&clipped, &want, TOL, &what);
    }
}

fn check_tensorflow(case: &Case) {
    let clip_norm = case.f64("clip_norm");
    let (report, clipped) = run_clip(&case.grads, &case.sizes, |set, enc| {
        set.clip_norm(enc, &ClipNorm::tensorflow(clip_norm as f32))
    });
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
        assert_identical(&clipped, &want, &what);
    } else {
        assert_close(&clipped, &want, TOL, &what);
    }
}

fn check_value(case: &Case) {
    let v = case.f64("clip_value") as f32;
    let (_, clipped) = run_clip(&case.grads, &case.sizes, |set, enc| {
        set.clip_value(enc, -v, v)
    });
    assert_identical(
        &clipped,
        &case.floats("torch_clipped"),
        &format!("{}: clamped", case.name),
    );
}

#[test]
fn all_24_golden_cases() {
    let cases = cases();
    assert_eq!(cases.len(), 24, "golden case count");
    let mut failures = Vec::new();
    for case in &cases {
        let outcome = std::panic::catch_unwind(|| match case.kind.as_str() {
            "clip_norm" => check_clip_norm(case),
            "clip_by_global_norm" => check_tensorflow(case),
            "clip_value" => check_value(case),
            other => panic!("unknown golden kind {other}"),
        });
        match outcome {
            Ok(()) => eprintln!("ok   {} {}", case.kind, case.name),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("FAIL {} {}: {msg}", case.kind, case.name);
                failures.push(case.name.clone());
            }
        }
    }
    assert!(failures.is_empty(), "golden cases failed: {failures:?}");
}
