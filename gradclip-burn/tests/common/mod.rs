//! What the burn tests share: one burn wgpu runtime per test binary, a
//! small model with fresh data every step, and float64 references.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard, OnceLock};

use burn::backend::wgpu::WgpuSetup;
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;

/// burn's runtime on the adapter WGPU_BACKEND names; a test without one fails.
pub fn runtime() -> (Device, WgpuSetup) {
    static RUNTIME: OnceLock<(Device, WgpuSetup)> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let (device, setup) = gradclip_burn::init_from_env().expect(
                "no wgpu adapter: these tests need one (WGPU_BACKEND=vulkan runs on lavapipe)",
            );
            eprintln!("adapter: {:?}", setup.adapter.get_info());
            (device, setup)
        })
        .clone()
}

/// The tests share one device; each test's steps run alone so that its
/// allocation pattern (and rebind count) is its own.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Module, Debug)]
pub struct Mlp {
    pub input: Linear,
    pub hidden: Linear,
    pub output: Linear,
}

impl Mlp {
    pub fn new(device: &Device) -> Self {
        Self {
            input: LinearConfig::new(12, 32).init(device),
            hidden: LinearConfig::new(32, 32).init(device),
            output: LinearConfig::new(32, 3).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let h = self.input.forward(x).tanh();
        let h = self.hidden.forward(h).tanh();
        self.output.forward(h)
    }
}

/// A batch that differs every step: inputs and targets scaled by `scale`.
pub fn batch(device: &Device, scale: f64) -> (Tensor<2>, Tensor<2>) {
    let x = Tensor::<2>::random([16, 12], Distribution::Normal(0.0, scale), device);
    let y = Tensor::<2>::random([16, 3], Distribution::Normal(0.0, scale), device);
    (x, y)
}

/// Mean squared error of the model on a batch.
pub fn loss(model: &Mlp, x: Tensor<2>, y: Tensor<2>) -> Tensor<1> {
    (model.forward(x) - y).powi_scalar(2).mean()
}

/// Float parameters in visiting order: (id, rank).
pub fn param_ids<M: Module>(model: &M) -> Vec<(ParamId, usize)> {
    struct Ids(Vec<(ParamId, usize)>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push((param.id, D));
        }
    }
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    ids.0
}

/// Float parameter values in visiting order, without autodiff.
pub fn param_values<M: Module>(model: &M) -> Vec<Tensor<1>> {
    struct Values(Vec<Tensor<1>>);
    impl ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().inner().flatten::<1>(0, D - 1));
        }
    }
    let mut values = Values(Vec::new());
    model.visit(&mut values);
    values.0
}

/// A gradient as a flat tensor sharing its storage (a view, no kernel).
pub fn grad_view(grads: &GradientsParams, (id, rank): (ParamId, usize)) -> Tensor<1> {
    match rank {
        1 => grads.get::<1>(id).unwrap(),
        2 => grads.get::<2>(id).unwrap().flatten::<1>(0, 1),
        _ => unreachable!("the test models have ranks 1 and 2"),
    }
}

/// A copy of a tensor made by a kernel queued now (lazily, like any burn op):
/// it runs where it stands in the queue, which is what the ordering tests need.
pub fn snapshot(t: Tensor<1>) -> Tensor<1> {
    t.mul_scalar(1.0)
}

/// The values as f64, read back (tests only).
pub fn read(t: Tensor<1>) -> Vec<f64> {
    t.into_data().convert::<f64>().try_to_vec::<f64>().unwrap()
}

pub fn l2(tensors: &[Vec<f64>]) -> f64 {
    tensors.iter().flatten().map(|v| v * v).sum::<f64>().sqrt()
}

/// `|a - b| <= tol * max(1, |b|)`, elementwise, with a message naming the worst.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        assert!(!err.is_nan(), "{what}[{i}]: got {g}, want {w}");
        if err > worst.0 {
            worst = (err, i);
        }
    }
    let (err, i) = worst;
    assert!(
        err <= tol,
        "{what}[{i}]: got {}, want {} (relative error {err:e} > {tol:e})",
        got[i],
        want[i]
    );
}
