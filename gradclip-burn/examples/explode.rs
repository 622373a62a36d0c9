//! A deep tanh MLP on synthetic regression data at a learning rate where its
//! gradients explode, trained three ways from the same seed: no clipping,
//! burn's per-parameter `GradientClipping::Norm`, and gradclip's global norm.
//! Writes a plot of loss and global gradient norm per step.
//!
//! ```sh
//! WGPU_BACKEND=vulkan cargo run --release -p gradclip-burn --example explode -- --plot target/explode.svg
//! ```

use std::time::{Duration, Instant};

use burn::grad_clipping::GradientClippingConfig;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn::tensor::Distribution;
use clap::Parser;
use gradclip_burn::{ClipNorm, GradClipper};
use plotters::prelude::*;

#[derive(Parser)]
struct Args {
    /// Training steps per run.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// SGD learning rate (high enough to explode without clipping).
    #[arg(long, default_value_t = 0.2)]
    lr: f64,
    /// The clipping threshold, for burn's per-parameter clip and gradclip's global one.
    #[arg(long, default_value_t = 1.0)]
    max_norm: f32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where to write the SVG plot.
    #[arg(long, default_value = "target/explode.svg")]
    plot: String,
}

#[derive(Module, Debug)]
struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        let widths = [16, 64, 64, 64, 64, 64, 4];
        let layers = widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(device))
            .collect();
        Self { layers }
    }

    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i < last {
                x = x.tanh();
            }
        }
        x
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Method {
    None,
    BurnPerParameter,
    GradclipGlobal,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::None => "no clipping",
            Method::BurnPerParameter => "burn GradientClipping::Norm (per parameter)",
            Method::GradclipGlobal => "gradclip global norm",
        }
    }
}

struct Run {
    losses: Vec<f64>,
    norms: Vec<f64>,
    clip_host: Duration,
    rebinds: u64,
    rebuilds: u64,
}

/// The teacher: a fixed random linear map with large outputs, so that the
/// student's early gradients are large.
fn data(device: &Device, teacher: &Tensor<2>) -> (Tensor<2>, Tensor<2>) {
    let x = Tensor::<2>::random([64, 16], Distribution::Normal(0.0, 1.0), device);
    let y = x.clone().matmul(teacher.clone()).tanh().mul_scalar(8.0);
    (x, y)
}

fn train(
    method: Method,
    args: &Args,
    device: &Device,
    setup: &burn::backend::wgpu::WgpuSetup,
) -> Result<Run, Box<dyn std::error::Error>> {
    device.seed(args.seed);
    let teacher = Tensor::<2>::random([16, 4], Distribution::Normal(0.0, 1.0), device);
    let mut model = Mlp::new(device);
    let mut config = SgdConfig::new();
    if method == Method::BurnPerParameter {
        config = config.with_gradient_clipping(Some(GradientClippingConfig::Norm(args.max_norm)));
    }
    let mut optimizer = config.init();
    // Every run measures the global norm with gradclip; the unclipped runs
    // "clip" at f32::MAX, which multiplies by exactly 1 (nothing is scaled).
    let max_norm = if method == Method::GradclipGlobal {
        args.max_norm
    } else {
        f32::MAX
    };
    let mut clipper = GradClipper::new(setup, ClipNorm::new(max_norm))?;
    let mut losses = Vec::new();
    let mut norms = Vec::new();
    let mut clip_host = Duration::ZERO;
    for _ in 0..args.steps {
        let (x, y) = data(device, &teacher);
        let loss = (model.forward(x) - y).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let started = Instant::now();
        let grads = clipper.clip(&model, grads)?;
        clip_host += started.elapsed();
        model = optimizer.step(args.lr, model, grads);
        // Reading the loss waits for the step; the norm comes back without waiting.
        losses.push(loss.into_scalar::<f32>() as f64);
        norms.extend(
            clipper
                .poll_reports()?
                .reports
                .iter()
                .map(|r| r.total_norm as f64),
        );
    }
    norms.extend(
        clipper
            .take_reports()?
            .reports
            .iter()
            .map(|r| r.total_norm as f64),
    );
    Ok(Run {
        losses,
        norms,
        clip_host,
        rebinds: clipper.rebinds(),
        rebuilds: clipper.rebuilds(),
    })
}

/// Which of a run's per-step values a panel shows.
type Series = fn(&Run) -> &Vec<f64>;

fn plot(path: &str, runs: &[(Method, Run)]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(380);
    let colors = [RED, BLUE, RGBColor(0, 150, 0)];
    let panels: [(&DrawingArea<_, _>, &str, Series); 2] = [
        (&top, "training loss (MSE)", |r| &r.losses),
        (&bottom, "global gradient norm before clipping", |r| {
            &r.norms
        }),
    ];
    for (area, title, series) in panels {
        let finite = |v: &f64| v.is_finite() && *v > 0.0;
        let all: Vec<f64> = runs
            .iter()
            .flat_map(|(_, r)| series(r).iter().copied().filter(finite))
            .collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(1e-6);
        let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
        let steps = runs.iter().map(|(_, r)| series(r).len()).max().unwrap_or(1);
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0..steps, (lo..hi).log_scale())?;
        chart.configure_mesh().x_desc("step").draw()?;
        for ((method, run), color) in runs.iter().zip(colors) {
            let points: Vec<(usize, f64)> = series(run)
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, v)| finite(v))
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(method.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (device, setup) = gradclip_burn::init_from_env()?;
    println!("adapter: {}", setup.adapter.get_info().name);
    let device = device.autodiff();
    let mut runs = Vec::new();
    for method in [
        Method::None,
        Method::BurnPerParameter,
        Method::GradclipGlobal,
    ] {
        let run = train(method, &args, &device, &setup)?;
        let last = run.losses.last().copied().unwrap_or(f64::NAN);
        let best = run
            .losses
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .fold(f64::INFINITY, f64::min);
        let nonfinite = run.losses.iter().filter(|v| !v.is_finite()).count();
        println!(
            "{:<45} final loss {last:>10.4}  best {best:>8.4}  non-finite steps {nonfinite:>3}  max norm {:>10.3e}  clip() host {:>6.1} us/step  rebinds {} (built {})",
            method.name(),
            run.norms.iter().copied().fold(0.0, f64::max),
            run.clip_host.as_secs_f64() * 1e6 / args.steps as f64,
            run.rebinds,
            run.rebuilds,
        );
        runs.push((method, run));
    }
    if let Some(dir) = std::path::Path::new(&args.plot).parent() {
        std::fs::create_dir_all(dir)?;
    }
    plot(&args.plot, &runs)?;
    println!("plot: {}", args.plot);
    Ok(())
}
