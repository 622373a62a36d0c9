//! Trains a vanilla RNN whose gradients explode, on the GPU, twice from the
//! same start: with gradclip clipping the global gradient norm before each
//! SGD step, and without. Prints a table per epoch and writes an SVG plot of
//! loss and gradient norm.
//!
//! `cargo run --release --example train -- --clip 1.0` (`--help` for the
//! options; `WGPU_BACKEND=vulkan|gl` picks the adapter). The same trainer runs
//! in the browser: see `examples/train/web/` and docs/browser.md.

mod model;
mod trainer;

use clap::Parser;

use model::Config;
use trainer::{StepReport, Trainer};

#[derive(Parser, Debug)]
#[command(about = "Train an RNN with exploding gradients, with and without gradclip")]
struct Args {
    /// Max global L2 norm of the gradients (PyTorch's clip_grad_norm_ semantics).
    #[arg(long, default_value_t = 1.0)]
    clip: f32,
    /// SGD learning rate.
    #[arg(long, default_value_t = Config::default().lr)]
    lr: f32,
    /// Training steps of each run.
    #[arg(long, default_value_t = 400)]
    steps: u32,
    /// Steps per row of the table.
    #[arg(long, default_value_t = 25)]
    epoch: u32,
    /// Seed of the initial weights and of the data.
    #[arg(long, default_value_t = Config::default().seed)]
    seed: u32,
    /// Where to write the plot (SVG).
    #[arg(long, default_value = "train.svg")]
    plot: std::path::PathBuf,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if !(args.clip > 0.0 && args.clip.is_finite()) || args.epoch == 0 || args.steps == 0 {
        return Err("--clip must be positive and finite, --steps and --epoch at least 1".into());
    }
    let config = Config {
        lr: args.lr,
        seed: args.seed,
        ..Config::default()
    };
    let (device, queue, info) = pollster::block_on(gradclip::default_device())?;
    let trainer = Trainer::new(&device, &queue, info, config)?;
    let info = &trainer.info;
    println!(
        "adapter: {} ({:?}, {:?})",
        info.name, info.backend, info.device_type
    );
    println!(
        "model: vanilla RNN, {} hidden units, sequences of {}, batch {}, {} parameters in one \
         gradient buffer; SGD at lr {}; task: output the running sum of the inputs",
        config.hidden,
        config.seq_len,
        config.batch,
        config.param_count(),
        config.lr
    );

    let started = std::time::Instant::now();
    let clipped = run(&trainer, Some(args.clip), args.steps)?;
    let clip_secs = started.elapsed().as_secs_f64();
    trainer.reset();
    let unclipped = run(&trainer, None, args.steps)?;

    print_table(&args, &clipped, &unclipped);
    println!(
        "{:.1} ms per step with clipping ({} steps in {:.2} s, reports read back every step)",
        clip_secs * 1e3 / args.steps as f64,
        args.steps,
        clip_secs
    );
    if let Some(dir) = args.plot.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    plot::write(&args.plot, args.clip, &clipped, &unclipped)?;
    println!("plot: {}", args.plot.display());
    Ok(())
}

fn run(
    trainer: &Trainer,
    max_norm: Option<f32>,
    steps: u32,
) -> Result<Vec<StepReport>, Box<dyn std::error::Error>> {
    let mut reports = Vec::with_capacity(steps as usize);
    for _ in 0..steps {
        trainer.submit_step(max_norm)?;
        reports.push(pollster::block_on(trainer.report())?);
    }
    Ok(reports)
}

/// `x` in `width` columns: fixed point while it fits, scientific beyond.
fn num(x: f32, width: usize, decimals: usize) -> String {
    if x.is_finite() && x.abs() >= 1e4 {
        format!("{x:>width$.2e}")
    } else {
        format!("{x:>width$.decimals$}")
    }
}

/// Mean loss, mean and max gradient norm, and clipped steps of one epoch.
fn summary(reports: &[StepReport]) -> String {
    let n = reports.len() as f32;
    let loss = reports.iter().map(|r| r.loss).sum::<f32>() / n;
    let norm = reports.iter().map(|r| r.grad_norm).sum::<f32>() / n;
    let max = reports.iter().map(|r| r.grad_norm).fold(0.0f32, |m, x| {
        if x.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(x)
        }
    });
    let clipped = reports.iter().filter(|r| r.coefficient < 1.0).count();
    format!(
        "{} {} {} {clipped:>4}",
        num(loss, 10, 4),
        num(norm, 10, 3),
        num(max, 10, 3)
    )
}

fn print_table(args: &Args, clipped: &[StepReport], unclipped: &[StepReport]) {
    println!();
    println!(
        "{:>5} {:>9} | {:^37} | {:^37}",
        "epoch",
        "steps",
        format!("clip at {}", args.clip),
        "no clipping"
    );
    let cols = format!(
        "{:>10} {:>10} {:>10} {:>4}",
        "loss", "norm", "max norm", "clip"
    );
    println!("{:>5} {:>9} | {cols} | {cols}", "", "");
    let epoch = args.epoch as usize;
    for (e, (a, b)) in clipped
        .chunks(epoch)
        .zip(unclipped.chunks(epoch))
        .enumerate()
    {
        let first = e * epoch + 1;
        println!(
            "{:>5} {:>9} | {} | {}",
            e + 1,
            format!("{}-{}", first, first + a.len() - 1),
            summary(a),
            summary(b)
        );
    }
    println!("(loss: mean squared error, norm: global L2 norm of the gradients before clipping, clip: steps clipped)");
}

mod plot {
    use plotters::prelude::*;

    use super::StepReport;

    /// Loss (top) and gradient norm (bottom) per step, both runs, log scales.
    pub fn write(
        path: &std::path::Path,
        clip: f32,
        clipped: &[StepReport],
        unclipped: &[StepReport],
    ) -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 720)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(360);
        let steps = clipped.len().max(unclipped.len()) as f32;
        let runs = [
            (
                clipped,
                RGBColor(31, 119, 180),
                format!("clipped to norm {clip}"),
            ),
            (unclipped, RGBColor(214, 39, 40), "no clipping".to_string()),
        ];
        // Log scales, capped so that a diverging run does not flatten the
        // other: values past the cap are drawn at the top edge.
        for (area, title, value, cap) in [
            (
                &top,
                "loss (MSE)",
                (|r: &StepReport| r.loss) as fn(&StepReport) -> f32,
                1e3,
            ),
            (
                &bottom,
                "gradient norm before clipping",
                |r: &StepReport| r.grad_norm,
                1e4,
            ),
        ] {
            // Log axes over the finite, positive values; divergence shows as the line ending.
            let finite = runs
                .iter()
                .flat_map(|(rs, _, _)| rs.iter().map(value))
                .filter(|v| v.is_finite() && *v > 0.0);
            let (lo, hi) = finite.fold((f32::MAX, f32::MIN_POSITIVE), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
            let (lo, hi) = (lo.min(hi).min(clip) * 0.8, hi.min(cap) * 1.25);
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(0f32..steps, (lo..hi).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("step")
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| format!("{v:.0e}"))
                .draw()?;
            for (reports, color, label) in &runs {
                let points = reports
                    .iter()
                    .map(|r| (r.step as f32, value(r)))
                    .take_while(|(_, v)| v.is_finite())
                    .map(|(s, v)| (s, v.clamp(lo, hi)));
                chart
                    .draw_series(LineSeries::new(points, color))?
                    .label(label.as_str())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
            }
            if title.starts_with("gradient") {
                chart
                    .draw_series(LineSeries::new(
                        [(0.0, clip.clamp(lo, hi)), (steps, clip.clamp(lo, hi))],
                        BLACK.mix(0.5),
                    ))?
                    .label("max norm")
                    .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.mix(0.5)));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trainer() -> Trainer {
        let (device, queue, info) = pollster::block_on(gradclip::default_device())
            .unwrap_or_else(|e| panic!("no wgpu adapter for the demo's tests: {e}"));
        Trainer::new(&device, &queue, info, Config::default()).expect("Trainer::new")
    }

    /// The WGSL forward pass and back-propagation through time agree with
    /// the float64 reference on the first step.
    #[test]
    fn gpu_gradients_match_the_float64_reference() {
        let t = trainer();
        let cfg = *t.config();
        let (loss, grads) = t.gradients_now();
        let (want_loss, want) = model::reference_step(&cfg, &cfg.initial_params(), 0);
        assert!(
            ((loss as f64) - want_loss).abs() <= 1e-4 * want_loss,
            "loss {loss}, want {want_loss}"
        );
        let norm = want.iter().map(|g| g * g).sum::<f64>().sqrt();
        // Relative to each element, with an absolute slack of 1e-5 of the
        // norm for elements that are sums of many cancelling terms.
        for (i, (&g, &w)) in grads.iter().zip(&want).enumerate() {
            assert!(
                ((g as f64) - w).abs() <= 1e-4 * w.abs() + 1e-5 * norm,
                "gradient {i}: {g}, want {w}"
            );
        }
    }

    /// With clipping the loss falls and every step's update is at most
    /// max_norm long; the norms reported are the reference's at step 1.
    #[test]
    fn clipped_training_learns() {
        let t = trainer();
        let reports = run(&t, Some(0.25), 150).unwrap();
        assert_eq!(reports.last().unwrap().step, 150);
        let (_, want) = model::reference_step(t.config(), &t.config().initial_params(), 0);
        let norm0 = want.iter().map(|g| g * g).sum::<f64>().sqrt();
        assert!((reports[0].grad_norm as f64 - norm0).abs() <= 1e-4 * norm0);
        for r in &reports {
            assert!(r.loss.is_finite() && r.grad_norm.is_finite(), "{r:?}");
            assert!(r.grad_norm * r.coefficient <= 0.25 * (1.0 + 1e-5), "{r:?}");
        }
        let mean = |rs: &[StepReport]| rs.iter().map(|r| r.loss).sum::<f32>() / rs.len() as f32;
        let (first, last) = (mean(&reports[..20]), mean(&reports[130..]));
        assert!(last < 0.6 * first, "loss went from {first} to {last}");
    }
}
