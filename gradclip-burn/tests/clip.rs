//! gradclip-burn against float64 references computed from burn's own
//! gradients, over steps with fresh data, with nothing synchronised between
//! backward, clip and optimizer step (reads happen after all three are queued).

mod common;

use burn::module::{Module, Param};
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::prelude::*;
use burn::tensor::TensorData;
use common::*;
use gradclip_burn::{Clip, ClipNorm, GradClipper, Norm};

/// The float64 factor of a PyTorch-semantics clip.
fn torch_coef(max_norm: f64, total: f64) -> f64 {
    (max_norm / (total + 1e-6)).min(1.0)
}

fn norm_of(norm: Norm, tensors: &[Vec<f64>]) -> f64 {
    let all = tensors.iter().flatten();
    match norm {
        Norm::L1 => all.map(|v| v.abs()).sum(),
        Norm::L2 => all.map(|v| v * v).sum::<f64>().sqrt(),
        Norm::Inf => all.map(|v| v.abs()).fold(0.0, f64::max),
        Norm::P(p) => {
            let p = p as f64;
            all.map(|v| v.abs().powf(p)).sum::<f64>().powf(1.0 / p)
        }
    }
}

/// One training step, every value the checks need snapshotted by kernels
/// queued in order, read back only at the end.
struct Step {
    /// Gradients as backward wrote them (before the clip).
    before: Vec<Vec<f64>>,
    /// The same gradients after the clip, as the optimizer saw them.
    after: Vec<Vec<f64>>,
    params_before: Vec<Vec<f64>>,
    params_after: Vec<Vec<f64>>,
}

fn step(
    clipper: &mut GradClipper,
    model: Mlp,
    optimizer: &mut ModuleOptimizer,
    lr: f64,
    data: (Tensor<2>, Tensor<2>),
) -> (Mlp, Step) {
    let ids = param_ids(&model);
    let grads = GradientsParams::from_grads(loss(&model, data.0, data.1).backward(), &model);
    let before: Vec<_> = ids
        .iter()
        .map(|&id| snapshot(grad_view(&grads, id)))
        .collect();
    let params_before: Vec<_> = param_values(&model).into_iter().map(snapshot).collect();
    let grads = clipper.clip(&model, grads).expect("clip");
    let after: Vec<_> = ids
        .iter()
        .map(|&id| snapshot(grad_view(&grads, id)))
        .collect();
    let model = optimizer.step(lr, model, grads);
    let params_after = param_values(&model);
    let step = Step {
        before: before.into_iter().map(read).collect(),
        after: after.into_iter().map(read).collect(),
        params_before: params_before.into_iter().map(read).collect(),
        params_after: params_after.into_iter().map(read).collect(),
    };
    (model, step)
}

/// Checks a step against `coefs` (one factor per tensor) and plain SGD.
fn check_step(label: &str, s: &Step, coefs: &[f64], lr: f64) {
    for (i, coef) in coefs.iter().enumerate() {
        let want: Vec<f64> = s.before[i].iter().map(|g| g * coef).collect();
        assert_close(
            &format!("{label}: clipped grad {i}"),
            &s.after[i],
            &want,
            1e-5,
        );
        let params: Vec<f64> = s.params_before[i]
            .iter()
            .zip(&want)
            .map(|(p, g)| p - lr * g)
            .collect();
        assert_close(
            &format!("{label}: param {i} after SGD"),
            &s.params_after[i],
            &params,
            1e-5,
        );
    }
}

#[test]
fn fifty_steps_of_fresh_data_match_float64_and_the_optimizer_sees_the_clip() {
    let (device, setup) = runtime();
    let _serial = serial();
    let device = device.autodiff();
    device.seed(7);
    let max_norm = 1.0;
    let lr = 0.05;
    let mut clipper =
        GradClipper::new(&setup, ClipNorm::new(max_norm as f32).tensor_norms(true)).unwrap();
    let mut model = Mlp::new(&device);
    let mut optimizer = SgdConfig::new().init();
    let mut norms = Vec::new();
    let mut reports = Vec::new();
    let mut built_by_step_5 = 0;
    for i in 0..50 {
        if i == 5 {
            built_by_step_5 = clipper.rebuilds();
        }
        // Scales from 0.05 to 3: some steps clip, some do not.
        let scale = 0.05 + (i % 7) as f64 * 0.5;
        let (next, s) = step(
            &mut clipper,
            model,
            &mut optimizer,
            lr,
            batch(&device, scale),
        );
        model = next;
        let total = l2(&s.before);
        let coef = torch_coef(max_norm, total);
        check_step(&format!("step {i}"), &s, &vec![coef; s.before.len()], lr);
        let tensor_norms: Vec<f64> = s
            .before
            .iter()
            .map(|t| l2(std::slice::from_ref(t)))
            .collect();
        norms.push((total, coef, tensor_norms));
        reports.extend(clipper.poll_reports().unwrap().reports);
    }
    let rest = clipper.take_reports().unwrap();
    assert_eq!(rest.dropped, 0);
    reports.extend(rest.reports);
    assert_eq!(reports.len(), 50, "one report per step");
    let clipped = norms.iter().filter(|n| n.1 < 1.0).count();
    assert!(
        clipped > 10 && clipped < 45,
        "the data should clip some steps and not others ({clipped})"
    );
    for (i, (r, (total, coef, tensor_norms))) in reports.iter().zip(&norms).enumerate() {
        assert_eq!(r.step, i as u64 + 1);
        assert_close(
            &format!("step {i}: total norm"),
            &[r.total_norm as f64],
            &[*total],
            1e-5,
        );
        assert_close(
            &format!("step {i}: coefficient"),
            &[r.coefficient as f64],
            &[*coef],
            1e-5,
        );
        let got: Vec<f64> = r.tensor_norms.iter().map(|&n| n as f64).collect();
        assert_close(&format!("step {i}: tensor norms"), &got, tensor_norms, 1e-5);
    }
    let names: Vec<&str> = clipper
        .named_norms(&reports[49])
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(
        names,
        [
            "input.weight",
            "input.bias",
            "hidden.weight",
            "hidden.bias",
            "output.weight",
            "output.bias"
        ]
    );
    assert_eq!(clipper.binds(), 1);
    assert_eq!(
        clipper.copies(),
        0,
        "a plain MLP's gradients own their storage"
    );
    // cubecl 0.11 hands the gradients out at new places of its pool almost
    // every step (see the README). Each such step moves the set by new
    // table bytes: never a bind from scratch, never new scratch or readback
    // buffers, and past the first steps never a new bind group.
    eprintln!(
        "rebinds over 50 steps: {} ({} built new bind groups, {built_by_step_5} by step 5)",
        clipper.rebinds(),
        clipper.rebuilds()
    );
    assert_eq!(clipper.binds(), 1);
    assert!(clipper.rebinds() <= 49);
    assert_eq!(
        clipper.rebuilds(),
        built_by_step_5,
        "steady-state steps build no GPU object"
    );
}

#[test]
fn every_norm_and_tensorflow_semantics_match_float64() {
    let (device, setup) = runtime();
    let _serial = serial();
    let device = device.autodiff();
    device.seed(11);
    let lr = 0.01;
    let cases = [
        (Norm::L2, false),
        (Norm::L1, false),
        (Norm::Inf, false),
        (Norm::P(3.0), false),
        (Norm::P(0.5), false),
        (Norm::L2, true),
        (Norm::L1, true),
    ];
    let mut model = Mlp::new(&device);
    let mut optimizer = SgdConfig::new().init();
    for (norm, tf) in cases {
        let max_norm = 0.5;
        let clip = if tf {
            ClipNorm::tensorflow(max_norm)
        } else {
            ClipNorm::new(max_norm)
        }
        .norm(norm);
        let mut clipper = GradClipper::new(&setup, clip).unwrap();
        for i in 0..4 {
            let scale = [0.01, 0.3, 1.0, 3.0][i];
            let (next, s) = step(
                &mut clipper,
                model,
                &mut optimizer,
                lr,
                batch(&device, scale),
            );
            model = next;
            let total = norm_of(norm, &s.before);
            let m = max_norm as f64;
            let coef = if tf {
                m / total.max(m)
            } else {
                torch_coef(m, total)
            };
            check_step(
                &format!("{norm:?} tf={tf} step {i}"),
                &s,
                &vec![coef; s.before.len()],
                lr,
            );
            let report = clipper.read_report().unwrap();
            assert_close(
                &format!("{norm:?} tf={tf}: norm"),
                &[report.total_norm as f64],
                &[total],
                1e-5,
            );
        }
    }
}

#[test]
fn per_tensor_and_value_clipping_match_float64() {
    let (device, setup) = runtime();
    let _serial = serial();
    let device = device.autodiff();
    device.seed(13);
    let lr = 0.01;
    let mut model = Mlp::new(&device);
    let mut optimizer = SgdConfig::new().init();
    let mut clipper = GradClipper::new(&setup, ClipNorm::new(0.2).per_tensor(true)).unwrap();
    for i in 0..3 {
        let (next, s) = step(
            &mut clipper,
            model,
            &mut optimizer,
            lr,
            batch(&device, 1.0 + i as f64),
        );
        model = next;
        let coefs: Vec<f64> = s
            .before
            .iter()
            .map(|t| torch_coef(0.2, l2(std::slice::from_ref(t))))
            .collect();
        assert!(coefs.iter().any(|&c| c < 1.0));
        check_step(&format!("per tensor step {i}"), &s, &coefs, lr);
    }
    clipper
        .set_clip(Clip::Value {
            min: -0.01,
            max: 0.02,
        })
        .unwrap();
    let (_, s) = step(&mut clipper, model, &mut optimizer, lr, batch(&device, 2.0));
    for (i, (after, before)) in s.after.iter().zip(&s.before).enumerate() {
        let want: Vec<f64> = before
            .iter()
            .map(|&g| (g as f32).clamp(-0.01, 0.02) as f64)
            .collect();
        assert_close(&format!("value clip {i}"), after, &want, 0.0);
    }
    assert!(clipper
        .set_clip(Clip::Value {
            min: 1.0,
            max: -1.0
        })
        .is_err());
    assert!(GradClipper::new(&setup, ClipNorm::new(f32::NAN)).is_err());
}

/// A batch with one NaN target: the gradients it reaches are NaN, others
/// (other rows of the output layer) stay finite.
fn nan_batch(device: &Device) -> (Tensor<2>, Tensor<2>) {
    let (x, y) = batch(device, 1.0);
    let mut mask = vec![false; 16 * 3];
    mask[1] = true;
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(mask, [16, 3]), device);
    (x, y.mask_fill(mask, f32::NAN))
}

fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

#[test]
fn a_nan_gradient_makes_every_gradient_nan_as_in_pytorch() {
    let (device, setup) = runtime();
    let _serial = serial();
    let device = device.autodiff();
    let model = Mlp::new(&device);
    let mut optimizer = SgdConfig::new().init();
    let mut clipper = GradClipper::new(&setup, ClipNorm::new(1.0)).unwrap();
    let (_, s) = step(&mut clipper, model, &mut optimizer, 0.1, nan_batch(&device));
    assert!(s.before.iter().flatten().any(|g| g.is_nan()));
    assert!(
        s.before.iter().flatten().any(|g| !g.is_nan()),
        "some gradients are finite before the clip"
    );
    assert!(
        s.after.iter().flatten().all(|g| g.is_nan()),
        "PyTorch: NaN total norm, NaN coefficient, NaN everywhere"
    );
    let report = clipper.read_report().unwrap();
    assert!(report.total_norm.is_nan() && report.nonfinite);
}

#[test]
fn error_if_nonfinite_leaves_burns_gradients_untouched() {
    let (device, setup) = runtime();
    let _serial = serial();
    let device = device.autodiff();
    let model = Mlp::new(&device);
    let mut optimizer = SgdConfig::new().init();
    let mut clipper =
        GradClipper::new(&setup, ClipNorm::new(1e-3).error_if_nonfinite(true)).unwrap();
    let ids = param_ids(&model);
    let (x, y) = nan_batch(&device);
    let grads = GradientsParams::from_grads(loss(&model, x, y).backward(), &model);
    let before: Vec<_> = ids
        .iter()
        .map(|&id| snapshot(grad_view(&grads, id)))
        .collect();
    let grads = clipper.clip(&model, grads).unwrap();
    let after: Vec<Vec<f64>> = ids.iter().map(|&id| read(grad_view(&grads, id))).collect();
    let before: Vec<Vec<f64>> = before.into_iter().map(read).collect();
    assert!(before.concat().iter().any(|g| g.is_nan()));
    assert!(
        same_bits(&after.concat(), &before.concat()),
        "gradients untouched"
    );
    // The optimizer step is skipped, as after PyTorch's raise.
    drop(grads);
    match clipper.read_report() {
        Err(gradclip_burn::Error::Clip(gradclip::Error::NonFinite { total_norm })) => {
            assert!(total_norm.is_nan())
        }
        other => panic!("expected NonFinite, got {other:?}"),
    }
    // A finite step after it clips again.
    let (_, s) = step(
        &mut clipper,
        model,
        &mut optimizer,
        0.0,
        batch(&device, 3.0),
    );
    let coef = torch_coef(1e-3, l2(&s.before));
    assert!(coef < 1.0);
    check_step("finite step", &s, &vec![coef; s.before.len()], 0.0);
}

#[test]
fn gradients_at_new_places_are_rebound_and_still_exact() {
    let (device, setup) = runtime();
    let _serial = serial();
    let device = device.autodiff();
    let model = Mlp::new(&device);
    let mut clipper = GradClipper::new(&setup, ClipNorm::new(0.1)).unwrap();
    let ids = param_ids(&model);
    let mut kept = Vec::new();
    for i in 0..3 {
        let (x, y) = batch(&device, 1.0 + i as f64);
        let grads = GradientsParams::from_grads(loss(&model, x, y).backward(), &model);
        let before: Vec<Vec<f64>> = ids
            .iter()
            .map(|&id| read(snapshot(grad_view(&grads, id))))
            .collect();
        let grads = clipper.clip(&model, grads).unwrap();
        let after: Vec<Vec<f64>> = ids.iter().map(|&id| read(grad_view(&grads, id))).collect();
        let coef = torch_coef(0.1, l2(&before));
        for (a, b) in after.iter().zip(&before) {
            let want: Vec<f64> = b.iter().map(|g| g * coef).collect();
            assert_close(&format!("step {i}"), a, &want, 1e-5);
        }
        // The same gradients again: found where they were, nothing rebound.
        let rebinds = clipper.rebinds();
        let grads = clipper.clip(&model, grads).unwrap();
        assert_eq!(
            clipper.rebinds(),
            rebinds,
            "unchanged places are not rebound"
        );
        let again: Vec<Vec<f64>> = ids.iter().map(|&id| read(grad_view(&grads, id))).collect();
        let coef2 = torch_coef(0.1, l2(&after));
        for (a, b) in again.iter().zip(&after) {
            let want: Vec<f64> = b.iter().map(|g| g * coef2).collect();
            assert_close(&format!("step {i}, second clip"), a, &want, 1e-5);
        }
        // Held gradients keep their storage: the next step's must be elsewhere.
        kept.push(grads);
    }
    assert_eq!(clipper.binds(), 1);
    assert_eq!(
        clipper.rebinds(),
        2,
        "each step found the gradients at new places"
    );
    assert_eq!(clipper.take_reports().unwrap().reports.len(), 6);
}

/// A model whose gradients burn hands out as a strided view (a transposed
/// weight) and as one tensor shared by two parameters (`a + b`).
#[derive(Module, Debug)]
struct Odd {
    w: Param<Tensor<2>>,
    a: Param<Tensor<1>>,
    b: Param<Tensor<1>>,
}

#[test]
fn strided_and_shared_gradients_are_copied_and_clipped_once() {
    let (device, setup) = runtime();
    let _serial = serial();
    let device = device.autodiff();
    let init = |shape: [usize; 2]| {
        Tensor::<2>::random(shape, burn::tensor::Distribution::Normal(0.0, 1.0), &device)
    };
    let model = Odd {
        w: Param::from_tensor(init([5, 7])),
        a: Param::from_tensor(init([1, 7]).flatten(0, 1)),
        b: Param::from_tensor(init([1, 7]).flatten(0, 1)),
    };
    let x = init([4, 7]);
    let h = x.clone().matmul(model.w.val().transpose()); // [4, 5]; dW is a transposed view
    let s = (model.a.val() + model.b.val()).unsqueeze_dim::<2>(0) * x; // da and db: one tensor
    let loss = h.powi_scalar(2).sum() + s.sum();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let ids = param_ids(&model);
    let before: Vec<Vec<f64>> = ids
        .iter()
        .map(|&id| read(snapshot(grad_view(&grads, id))))
        .collect();
    let mut clipper = GradClipper::new(&setup, ClipNorm::new(0.5)).unwrap();
    let grads = clipper.clip(&model, grads).unwrap();
    let after: Vec<Vec<f64>> = ids.iter().map(|&id| read(grad_view(&grads, id))).collect();
    let coef = torch_coef(0.5, l2(&before));
    assert!(coef < 1.0);
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        let want: Vec<f64> = b.iter().map(|g| g * coef).collect();
        assert_close(&format!("param {i}"), a, &want, 1e-5);
    }
    assert_eq!(
        clipper.copies(),
        2,
        "the transposed and the shared gradient"
    );
}
