use burn::backend::fusion::FusionTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor, WgpuResource};
use burn::backend::Cube;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;

#[derive(Module, Debug)]
struct Mlp {
    a: Linear,
    b: Linear,
}

struct Ids(Vec<(burn::module::ParamId, String, usize)>);
impl ModuleVisitor for Ids {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push((param.id, format!("{:?}", param.shape()), D));
    }
}

fn main() {
    let (device, setup) = Device::wgpu_options().init_with_setup().unwrap();
    println!("adapter {:?}", setup.adapter.get_info());
    let ad = device.clone().autodiff();
    let model = Mlp { a: LinearConfig::new(8, 16).init(&ad), b: LinearConfig::new(16, 4).init(&ad) };
    let x = Tensor::<2>::random([5, 8], burn::tensor::Distribution::Default, &ad);
    let loss = model.b.forward(model.a.forward(x)).powi_scalar(2).sum();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let mut ids = Ids(vec![]);
    model.visit(&mut ids);
    for (id, shape, d) in &ids.0 {
        let t: Tensor<2> = match d { 2 => grads.get::<2>(*id).unwrap(), _ => grads.get::<1>(*id).unwrap().unsqueeze() };
        let prim: FusionTensor<_> = t.try_into_primitive::<Cube>().unwrap();
        let client = prim.client.clone();
        let cube: CubeTensor = client.resolve_tensor_float::<CubeBackend>(prim);
        let res = cube.client.get_resource::<burn::cubecl::wgpu::WgpuServer<burn::cubecl::wgpu::AutoCompiler>>(cube.handle.clone()).unwrap();
        let r: &WgpuResource = res.resource();
        println!("{shape} D={d} {:?} buf={:?} off={} size={}", cube, r.buffer.global_id(), r.offset, r.size);
    }
}
