//! An f16 model: burn's wgpu backend hands out f16 gradients, which gradclip
//! clips as `GradType::F16` (norm accumulated in f32, factor applied in f32,
//! rounded once to f16). Its own test binary: a device's float type is set
//! once per process, before any tensor.

mod common;

use burn::optim::GradientsParams;
use burn::tensor::{DType, FloatDType};
use common::*;
use gradclip_burn::{ClipNorm, GradClipper, GradType};

#[test]
fn f16_gradients_are_clipped_as_f16() {
    let (mut device, setup) = runtime();
    assert!(
        device.supports_dtype(FloatDType::F16),
        "burn's wgpu backend should offer f16 here"
    );
    device
        .configure(FloatDType::F16)
        .expect("f16 as the default float type");
    let device = device.autodiff();
    device.seed(3);
    let model = Mlp::new(&device);
    let mut clipper = GradClipper::new(&setup, ClipNorm::new(0.25)).unwrap();
    let ids = param_ids(&model);
    for i in 0..5 {
        let (x, y) = batch(&device, 0.5 + i as f64);
        let grads = GradientsParams::from_grads(loss(&model, x, y).backward(), &model);
        assert_eq!(grads.get::<2>(ids[0].0).unwrap().dtype(), DType::F16);
        let before: Vec<_> = ids
            .iter()
            .map(|&id| snapshot(grad_view(&grads, id)))
            .collect();
        let grads = clipper.clip(&model, grads).unwrap();
        let after: Vec<Vec<f64>> = ids.iter().map(|&id| read(grad_view(&grads, id))).collect();
        let before: Vec<Vec<f64>> = before.into_iter().map(read).collect();
        let total = l2(&before);
        let coef = (0.25 / (total + 1e-6)).min(1.0);
        let report = clipper.read_report().unwrap();
        assert_close(
            &format!("step {i}: norm"),
            &[report.total_norm as f64],
            &[total],
            1e-5,
        );
        for (k, (a, b)) in after.iter().zip(&before).enumerate() {
            // One f16 rounding of the exact product: half an ulp, 2^-11 relative.
            let want: Vec<f64> = b.iter().map(|g| g * coef).collect();
            for (j, (got, want)) in a.iter().zip(&want).enumerate() {
                let tol = want.abs() * 2f64.powi(-11) + 6e-8;
                assert!(
                    (got - want).abs() <= tol,
                    "step {i} tensor {k}[{j}]: {got} vs {want}"
                );
            }
        }
    }
    assert!(matches!(
        clipper.grad_set().unwrap().element_paths()[0].grad_type(),
        GradType::F16
    ));
    assert_eq!(clipper.binds(), 1);
}
