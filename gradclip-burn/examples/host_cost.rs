//! Host time of `GradClipper::clip` per step for a model with GPT-2-small's
//! parameter *count* (148 tensors: embeddings, 12 blocks of two layer norms,
//! qkv, attention projection and MLP, a final layer norm) at a small width,
//! since the host cost depends on the number of tensors, not their size.
//! Measured in steady state (the gradients where they were) and with a rebind
//! every step (the previous step's gradients kept alive, so each step's land
//! elsewhere).
//!
//! ```sh
//! WGPU_BACKEND=vulkan cargo run --release -p gradclip-burn --example host_cost
//! ```

use std::time::{Duration, Instant};

use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::{Distribution, Int};
use clap::Parser;
use gradclip_burn::{ClipNorm, GradClipper};

#[derive(Parser)]
struct Args {
    /// Model width (GPT-2 small: 768).
    #[arg(long, default_value_t = 32)]
    width: usize,
    /// Timed steps per mode, after warm-up.
    #[arg(long, default_value_t = 30)]
    steps: usize,
}

#[derive(Module, Debug)]
struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc: Linear,
    out: Linear,
}

#[derive(Module, Debug)]
struct Gpt {
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

impl Gpt {
    fn new(d: usize, device: &Device) -> Self {
        let block = || Block {
            ln1: LayerNormConfig::new(d).init(device),
            qkv: LinearConfig::new(d, 3 * d).init(device),
            proj: LinearConfig::new(d, d).init(device),
            ln2: LayerNormConfig::new(d).init(device),
            fc: LinearConfig::new(d, 4 * d).init(device),
            out: LinearConfig::new(4 * d, d).init(device),
        };
        Self {
            wte: EmbeddingConfig::new(64, d).init(device),
            wpe: EmbeddingConfig::new(16, d).init(device),
            blocks: (0..12).map(|_| block()).collect(),
            ln_f: LayerNormConfig::new(d).init(device),
        }
    }

    /// Not attention: every parameter takes part, which is all the clip needs.
    fn loss(&self, tokens: Tensor<2, Int>, positions: Tensor<2, Int>) -> Tensor<1> {
        let mut h = self.wte.forward(tokens) + self.wpe.forward(positions);
        for b in &self.blocks {
            let [q, k, v] = b
                .qkv
                .forward(b.ln1.forward(h.clone()))
                .chunk(3, 2)
                .try_into()
                .unwrap();
            h = h + b.proj.forward((q * k).tanh() + v);
            h = h.clone()
                + b.out.forward(burn::tensor::activation::gelu(
                    b.fc.forward(b.ln2.forward(h)),
                ));
        }
        self.ln_f.forward(h).powi_scalar(2).mean()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (device, setup) = gradclip_burn::init_from_env()?;
    println!("adapter: {}", setup.adapter.get_info().name);
    let device = device.autodiff();
    let model = Gpt::new(args.width, &device);
    let tokens = Tensor::<2, Int>::random([4, 16], Distribution::Uniform(0.0, 64.0), &device);
    let positions = Tensor::<1, Int>::arange(0..16, &device)
        .unsqueeze_dim::<2>(0)
        .repeat_dim(0, 4);
    let mut clipper = GradClipper::new(&setup, ClipNorm::new(1.0))?;
    let mut kept: Option<GradientsParams> = None;
    for (mode, keep) in [("steady state", false), ("rebind every step", true)] {
        let (mut host, mut tensors) = (Duration::ZERO, 0);
        let rebinds_before = clipper.rebinds();
        for step in 0..args.steps + 3 {
            let grads = GradientsParams::from_grads(
                model.loss(tokens.clone(), positions.clone()).backward(),
                &model,
            );
            tensors = grads.len();
            let started = Instant::now();
            let grads = clipper.clip(&model, grads)?;
            if step >= 3 {
                host += started.elapsed();
            }
            // Wait for the step, so that the measurement is of the host alone.
            clipper.read_report()?;
            kept = if keep { Some(grads) } else { None };
        }
        drop(kept.take());
        println!(
            "{mode:<18} {tensors} tensors: clip() host {:.1} us/step over {} steps, rebinds {}",
            host.as_secs_f64() * 1e6 / args.steps as f64,
            args.steps,
            clipper.rebinds() - rebinds_before,
        );
    }
    Ok(())
}
