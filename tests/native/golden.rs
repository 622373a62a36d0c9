//! The 24 golden cases from PyTorch 2.15 and the TensorFlow formula, on the
//! adapter wgpu picks. Where PyTorch's float32 arithmetic overflows or
//! underflows, the exact float64 norm is the target. The checks themselves
//! are in `common/checks.rs`, shared with the browser suite.

use crate::common;

use common::checks::{verify, Op};
use common::golden::cases;
use common::run_clip;

#[test]
fn all_24_golden_cases() {
    let cases = cases();
    assert_eq!(cases.len(), 24, "golden case count");
    let mut failures = Vec::new();
    for case in &cases {
        let outcome = std::panic::catch_unwind(|| {
            let op = Op::of(case);
            let (report, clipped) =
                run_clip(&case.grads, &case.sizes, |set, enc| op.record(set, enc));
            verify(case, report, &clipped);
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
