//! Trains a vanilla RNN whose gradients explode, on the GPU, from the same
//! start in several clipping modes: gradclip clipping the global gradient
//! norm before each SGD step (a fixed max norm, ZClip or AutoClip), and no
//! clipping. Prints a table per epoch and writes an SVG plot of the loss,
//! and of the gradient norm next to each mode's threshold.
//!
//! `cargo run --release --example train -- --clip zclip` (`--help` for the
//! options; `WGPU_BACKEND=vulkan|gl` picks the adapter). The same trainer runs
//! in the browser: see `examples/train/web/` and docs/browser.md.

mod model;
mod trainer;

use clap::Parser;

use model::Config;
use trainer::{Adaptive, Mode, StepReport, Trainer};

/// `--clip`: a mode, or a number (the fixed mode at that max norm).
#[derive(Clone, Copy, Debug, PartialEq)]
enum ClipArg {
    Mode(Mode),
    MaxNorm(f32),
}

fn parse_clip(s: &str) -> Result<ClipArg, String> {
    match s.parse::<Mode>() {
        Ok(mode) => Ok(ClipArg::Mode(mode)),
        Err(e) => s
            .parse::<f32>()
            .map(ClipArg::MaxNorm)
            .map_err(|_| format!("{e}, or a max norm")),
    }
}

#[derive(Parser, Debug)]
#[command(about = "Train an RNN with exploding gradients, clipped by gradclip in several modes")]
struct Args {
    /// Clipping mode: none, fixed (a max norm), zclip or autoclip (adaptive
    /// thresholds computed on the GPU); trained next to a run without
    /// clipping. A number is the fixed mode at that max norm.
    #[arg(long, value_name = "MODE", default_value = "fixed", value_parser = parse_clip)]
    clip: ClipArg,
    /// Max global L2 norm of the fixed mode (PyTorch's clip_grad_norm_ semantics) [default: 1].
    #[arg(long)]
    max_norm: Option<f32>,
    /// Train every mode (none, fixed, zclip, autoclip) from the same start,
    /// into one table and one plot.
    #[arg(long)]
    compare: bool,
    /// ZClip: z-score above which a norm is a spike.
    #[arg(long, default_value_t = Adaptive::default().zclip.z_thresh)]
    zclip_z: f32,
    /// ZClip: steps whose norms start its EMA (no clipping before).
    #[arg(long, default_value_t = Adaptive::default().zclip.warmup_steps)]
    zclip_warmup: u32,
    /// AutoClip: the percentile of past norms clipped to.
    #[arg(long, default_value_t = Adaptive::default().autoclip.percentile)]
    autoclip_percentile: f32,
    /// AutoClip: past norms kept (at least the steps of the run: all of history).
    #[arg(long, default_value_t = Adaptive::default().autoclip.window)]
    autoclip_window: u32,
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
    /// Also write every step's report as CSV here.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
}

/// One training run: its mode, its name in the table and the plot, its reports.
pub struct Run {
    mode: Mode,
    label: String,
    reports: Vec<StepReport>,
    secs: f64,
}

/// A spike: a finite norm above `SPIKE_FACTOR` times the median of the
/// `SPIKE_WINDOW` finite norms before it (counted once that many exist).
const SPIKE_FACTOR: f32 = 3.0;
const SPIKE_WINDOW: usize = 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (mode, max_norm) = match (args.clip, args.max_norm) {
        (ClipArg::MaxNorm(_), Some(_)) => {
            return Err("give the max norm once: --clip <NUMBER> or --max-norm".into())
        }
        (ClipArg::MaxNorm(m), None) => (Mode::Fixed, m),
        (ClipArg::Mode(mode), m) => (mode, m.unwrap_or(1.0)),
    };
    if !(max_norm > 0.0 && max_norm.is_finite()) || args.epoch == 0 || args.steps == 0 {
        return Err(
            "the max norm must be positive and finite, --steps and --epoch at least 1".into(),
        );
    }
    let config = Config {
        lr: args.lr,
        seed: args.seed,
        ..Config::default()
    };
    let defaults = Adaptive::default();
    let adaptive = Adaptive {
        zclip: defaults
            .zclip
            .z_thresh(args.zclip_z)
            .warmup_steps(args.zclip_warmup),
        autoclip: gradclip::AutoClip {
            percentile: args.autoclip_percentile,
            ..defaults.autoclip.window(args.autoclip_window)
        },
    };
    let (device, queue, info) = pollster::block_on(gradclip::default_device())?;
    let trainer = Trainer::new(&device, &queue, info, config, adaptive)?;
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

    let modes: Vec<Mode> = if args.compare {
        vec![Mode::Fixed, Mode::ZClip, Mode::AutoClip, Mode::None]
    } else if mode == Mode::None {
        vec![Mode::None]
    } else {
        vec![mode, Mode::None]
    };
    let mut runs = Vec::with_capacity(modes.len());
    for (i, &mode) in modes.iter().enumerate() {
        if i > 0 {
            trainer.reset();
        }
        let started = std::time::Instant::now();
        let reports = run(&trainer, mode, max_norm, args.steps)?;
        runs.push(Run {
            mode,
            label: label(mode, max_norm, &adaptive),
            reports,
            secs: started.elapsed().as_secs_f64(),
        });
    }

    print_table(&args, &runs);
    println!();
    for run in &runs {
        print_summary(run, args.epoch as usize);
    }
    println!(
        "(spike: a norm above {SPIKE_FACTOR}x the median of the {SPIKE_WINDOW} finite norms \
         before it; reports, and ZClip's decision, read back after every step)"
    );
    if let Some(dir) = args.plot.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    plot::write(&args.plot, &runs)?;
    println!("plot: {}", args.plot.display());
    if let Some(path) = &args.csv {
        write_csv(path, &runs)?;
        println!("reports: {}", path.display());
    }
    Ok(())
}

fn label(mode: Mode, max_norm: f32, adaptive: &Adaptive) -> String {
    match mode {
        Mode::None => "no clipping".into(),
        Mode::Fixed => format!("clip at {max_norm}"),
        Mode::ZClip => format!(
            "ZClip z>{} (warm-up {})",
            adaptive.zclip.z_thresh, adaptive.zclip.warmup_steps
        ),
        Mode::AutoClip => format!("AutoClip p{}", adaptive.autoclip.percentile),
    }
}

fn run(
    trainer: &Trainer,
    mode: Mode,
    max_norm: f32,
    steps: u32,
) -> Result<Vec<StepReport>, trainer::TrainError> {
    let mut reports = Vec::with_capacity(steps as usize);
    for _ in 0..steps {
        trainer.submit_step(mode, max_norm)?;
        reports.push(pollster::block_on(trainer.report())?);
    }
    Ok(reports)
}

/// The indices of the spikes in `reports` (see [`SPIKE_FACTOR`]).
fn spikes(reports: &[StepReport]) -> Vec<usize> {
    let mut window: Vec<f32> = Vec::with_capacity(SPIKE_WINDOW);
    let mut spikes = Vec::new();
    let mut finite = Vec::with_capacity(reports.len());
    for (i, r) in reports.iter().enumerate() {
        if finite.len() >= SPIKE_WINDOW && r.grad_norm.is_finite() {
            window.clear();
            window.extend_from_slice(&finite[finite.len() - SPIKE_WINDOW..]);
            window.sort_by(f32::total_cmp);
            let median = 0.5 * (window[SPIKE_WINDOW / 2 - 1] + window[SPIKE_WINDOW / 2]);
            if r.grad_norm > SPIKE_FACTOR * median {
                spikes.push(i);
            }
        }
        if r.grad_norm.is_finite() {
            finite.push(r.grad_norm);
        }
    }
    spikes
}

fn write_csv(path: &std::path::Path, runs: &[Run]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(
        out,
        "mode,step,loss,grad_norm,coefficient,threshold,boundary"
    )?;
    for run in runs {
        for r in &run.reports {
            writeln!(
                out,
                "{},{},{},{},{},{},{}",
                r.mode, r.step, r.loss, r.grad_norm, r.coefficient, r.threshold, r.boundary
            )?;
        }
    }
    out.flush()
}

/// `x` in `width` columns: fixed point while it fits, scientific beyond.
fn num(x: f32, width: usize, decimals: usize) -> String {
    if x.is_finite() && x.abs() >= 1e4 {
        format!("{x:>width$.2e}")
    } else {
        format!("{x:>width$.decimals$}")
    }
}

fn nan_max(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(0.0f32, |m, x| {
        if x.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(x)
        }
    })
}

/// Mean loss, mean and max gradient norm, and clipped steps of one epoch;
/// `wide`: with the mean norm.
fn summary(reports: &[StepReport], wide: bool) -> String {
    let n = reports.len() as f32;
    let loss = reports.iter().map(|r| r.loss).sum::<f32>() / n;
    let norm = reports.iter().map(|r| r.grad_norm).sum::<f32>() / n;
    let max = nan_max(reports.iter().map(|r| r.grad_norm));
    let clipped = reports.iter().filter(|r| r.clipped()).count();
    if wide {
        format!(
            "{} {} {} {clipped:>4}",
            num(loss, 10, 4),
            num(norm, 10, 3),
            num(max, 10, 3)
        )
    } else {
        format!("{} {} {clipped:>4}", num(loss, 10, 4), num(max, 10, 3))
    }
}

fn print_table(args: &Args, runs: &[Run]) {
    // Two runs side by side fit the mean norm too; four do not.
    let wide = runs.len() <= 2;
    let cols = if wide {
        format!(
            "{:>10} {:>10} {:>10} {:>4}",
            "loss", "norm", "max norm", "clip"
        )
    } else {
        format!("{:>10} {:>10} {:>4}", "loss", "max norm", "clip")
    };
    let width = cols.len();
    println!();
    let titles: Vec<String> = runs
        .iter()
        .map(|r| format!("{:^width$}", r.label))
        .collect();
    println!("{:>5} {:>9} | {}", "epoch", "steps", titles.join(" | "));
    let all_cols = vec![cols; runs.len()];
    println!("{:>5} {:>9} | {}", "", "", all_cols.join(" | "));
    let epoch = args.epoch as usize;
    let epochs = runs[0].reports.len().div_ceil(epoch);
    for e in 0..epochs {
        let first = e * epoch;
        let last = (first + epoch).min(runs[0].reports.len());
        let cells: Vec<String> = runs
            .iter()
            .map(|r| summary(&r.reports[first..last], wide))
            .collect();
        println!(
            "{:>5} {:>9} | {}",
            e + 1,
            format!("{}-{}", first + 1, last),
            cells.join(" | ")
        );
    }
    println!(
        "(loss: mean squared error; {} global L2 norm of the gradients before clipping; \
         clip: steps clipped)",
        if wide {
            "norm, max norm: the mean and the largest"
        } else {
            "max norm: the largest"
        }
    );
}

/// One line per run: steps clipped, spikes caught, final loss, time.
fn print_summary(run: &Run, epoch: usize) {
    let reports = &run.reports;
    let clipped = reports.iter().filter(|r| r.clipped()).count();
    let spikes = spikes(reports);
    let caught = spikes.iter().filter(|&&i| reports[i].clipped()).count();
    let tail = &reports[reports.len().saturating_sub(epoch)..];
    let loss = tail.iter().map(|r| r.loss).sum::<f32>() / tail.len() as f32;
    let diverged = reports
        .iter()
        .find(|r| !(r.loss.is_finite() && r.grad_norm.is_finite()))
        .map(|r| format!(", diverged at step {}", r.step))
        .unwrap_or_default();
    println!(
        "{:<26} {clipped:>4} of {} steps clipped, {caught:>2} of {:>2} spikes clipped, \
         loss of the last {} steps {}{diverged}, {:.1} ms per step",
        format!("{}:", run.label),
        reports.len(),
        spikes.len(),
        tail.len(),
        num(loss, 0, 4),
        run.secs * 1e3 / reports.len() as f64,
    );
}

mod plot {
    use plotters::coord::Shift;
    use plotters::prelude::*;

    use super::{Mode, Run, StepReport};

    pub fn color(mode: Mode) -> RGBColor {
        match mode {
            Mode::None => RGBColor(214, 39, 40),
            Mode::Fixed => RGBColor(31, 119, 180),
            Mode::ZClip => RGBColor(44, 160, 44),
            Mode::AutoClip => RGBColor(148, 103, 189),
        }
    }

    /// Values past these are drawn at the top edge, so that a diverging run
    /// does not flatten the others.
    const LOSS_CAP: f32 = 1e3;
    const NORM_CAP: f32 = 1e4;
    const PANEL_HEIGHT: u32 = 300;

    /// The loss of every run (top), then per clipping run its gradient norm
    /// next to its threshold, clipped steps marked, with the unclipped run's
    /// norm faded behind; log scales.
    pub fn write(path: &std::path::Path, runs: &[Run]) -> Result<(), Box<dyn std::error::Error>> {
        let clipping: Vec<&Run> = runs.iter().filter(|r| r.mode != Mode::None).collect();
        let unclipped = runs.iter().find(|r| r.mode == Mode::None);
        let panels: Vec<&Run> = if clipping.is_empty() {
            unclipped.into_iter().collect()
        } else {
            clipping
        };
        let height = 360 + PANEL_HEIGHT * panels.len() as u32;
        let root = SVGBackend::new(path, (900, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, rest) = root.split_vertically(360);
        let steps = runs.iter().map(|r| r.reports.len()).max().unwrap_or(1) as f32;

        let loss = |r: &StepReport| r.loss;
        let (lo, hi) = range(
            runs.iter().flat_map(|r| r.reports.iter().map(loss)),
            LOSS_CAP,
        );
        let mut loss_chart = new_chart(&top, "loss (MSE)", steps, lo, hi)?;
        for run in runs {
            let c = color(run.mode);
            loss_chart
                .draw_series(LineSeries::new(line(&run.reports, loss, lo, hi), c))?
                .label(run.label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c));
        }
        legend(&mut loss_chart)?;

        let areas = rest.split_evenly((panels.len(), 1));
        for (area, run) in areas.iter().zip(panels) {
            let norm = |r: &StepReport| r.grad_norm;
            let boundary = |r: &StepReport| r.boundary;
            let shown = [Some(run), unclipped.filter(|u| u.mode != run.mode)];
            // The axis fits this run (the unclipped one's divergence runs
            // off the top), with a decade above for the legend.
            let values = run.reports.iter().flat_map(|r| [norm(r), boundary(r)]);
            let (lo, hi) = range(values, NORM_CAP);
            let hi = hi * 10.0;
            let title = format!("gradient norm before clipping: {}", run.label);
            let mut chart = new_chart(area, &title, steps, lo, hi)?;
            if let Some(u) = shown[1] {
                let faded = color(u.mode).mix(0.35);
                chart
                    .draw_series(LineSeries::new(line(&u.reports, norm, lo, hi), faded))?
                    .label(u.label.as_str())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], faded));
            }
            let c = color(run.mode);
            chart
                .draw_series(LineSeries::new(line(&run.reports, norm, lo, hi), c))?
                .label("gradient norm")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c));
            // The threshold is +inf where nothing could be clipped (ZClip's
            // warm-up): the line has a gap there.
            let mut labelled = false;
            for piece in finite_pieces(&run.reports, boundary) {
                let points = piece
                    .iter()
                    .map(|r| (r.step as f32, r.boundary.clamp(lo, hi)));
                let series = chart.draw_series(LineSeries::new(points, BLACK.stroke_width(1)))?;
                if !labelled {
                    labelled = true;
                    series
                        .label(match run.mode {
                            Mode::ZClip => "spike boundary (clipped above)",
                            _ => "threshold (clipped above)",
                        })
                        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK));
                }
            }
            if run.mode != Mode::None {
                // A clipped step: a ring on its norm, and a stroke down to
                // what it was clipped to (its threshold).
                let clipped = || {
                    run.reports
                        .iter()
                        .filter(|r| r.clipped() && r.grad_norm.is_finite())
                };
                let cut = BLACK.mix(0.45);
                chart.draw_series(clipped().map(|r| {
                    let s = r.step as f32;
                    let to = [r.threshold.clamp(lo, hi), r.grad_norm.clamp(lo, hi)];
                    PathElement::new([(s, to[0]), (s, to[1])], cut)
                }))?;
                chart
                    .draw_series(
                        clipped()
                            .map(|r| Circle::new((r.step as f32, r.grad_norm.clamp(lo, hi)), 2, c)),
                    )?
                    .label("clipped step (a stroke down to its threshold)")
                    .legend(move |(x, y)| Circle::new((x + 9, y), 2, c));
            }
            legend(&mut chart)?;
        }
        root.present()?;
        Ok(())
    }

    type Chart<'a> = ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<
            plotters::coord::types::RangedCoordf32,
            plotters::coord::combinators::LogCoord<f32>,
        >,
    >;

    fn new_chart<'a>(
        area: &DrawingArea<SVGBackend<'a>, Shift>,
        title: &str,
        steps: f32,
        lo: f32,
        hi: f32,
    ) -> Result<Chart<'a>, Box<dyn std::error::Error>> {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
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
        Ok(chart)
    }

    fn legend(chart: &mut Chart<'_>) -> Result<(), Box<dyn std::error::Error>> {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    }

    /// A log axis over the finite, positive values, capped at `cap`.
    fn range(values: impl Iterator<Item = f32>, cap: f32) -> (f32, f32) {
        let (lo, hi) = values
            .filter(|v| v.is_finite() && *v > 0.0)
            .fold((f32::MAX, f32::MIN_POSITIVE), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        (lo.min(hi) * 0.8, hi.min(cap) * 1.25)
    }

    /// The points of one series up to its first non-finite value:
    /// divergence shows as the line ending.
    fn line<'a>(
        reports: &'a [StepReport],
        value: impl Fn(&StepReport) -> f32 + 'a,
        lo: f32,
        hi: f32,
    ) -> impl Iterator<Item = (f32, f32)> + 'a {
        reports
            .iter()
            .map(move |r| (r.step as f32, value(r)))
            .take_while(|(_, v)| v.is_finite())
            .map(move |(s, v)| (s, v.clamp(lo, hi)))
    }

    /// The runs of consecutive reports whose `value` is finite.
    fn finite_pieces<'a>(
        reports: &'a [StepReport],
        value: impl Fn(&StepReport) -> f32 + 'a,
    ) -> impl Iterator<Item = &'a [StepReport]> {
        reports
            .split(move |r| !value(r).is_finite())
            .filter(|p| !p.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trainer() -> Trainer {
        trainer_with(Adaptive::default())
    }

    fn trainer_with(adaptive: Adaptive) -> Trainer {
        let (device, queue, info) = pollster::block_on(gradclip::default_device())
            .unwrap_or_else(|e| panic!("no wgpu adapter for the demo's tests: {e}"));
        Trainer::new(&device, &queue, info, Config::default(), adaptive).expect("Trainer::new")
    }

    /// A clipped step was scaled to its threshold, an unclipped one was at
    /// most its threshold.
    fn assert_threshold_applied(r: &StepReport) {
        assert!(r.loss.is_finite() && r.grad_norm.is_finite(), "{r:?}");
        if r.clipped() {
            // PyTorch's max_norm / (norm + 1e-6): a norm equal to the
            // threshold is scaled by a hair.
            assert!(r.grad_norm >= r.threshold, "{r:?}");
            let clipped_to = r.grad_norm * r.coefficient;
            assert!(
                (clipped_to - r.threshold).abs() <= 1e-5 * r.threshold,
                "{r:?}"
            );
        } else {
            assert!(r.coefficient == 1.0 && r.grad_norm <= r.threshold, "{r:?}");
        }
    }

    /// AutoClip's threshold is numpy's linear percentile of every norm so
    /// far (the window outlasts the run), computed here in float64 from the
    /// norms the steps reported, and the GPU clipped to it.
    #[test]
    fn autoclip_clips_to_the_percentile_of_the_norms_so_far() {
        let t = trainer();
        let p = Adaptive::default().autoclip.percentile as f64;
        let reports = run(&t, Mode::AutoClip, 1.0, 40).unwrap();
        let mut seen = Vec::new();
        for r in &reports {
            seen.push(r.grad_norm as f64);
            seen.sort_by(f64::total_cmp);
            let h = (seen.len() - 1) as f64 * p / 100.0;
            let (i, frac) = (h.floor() as usize, h.fract());
            let want = seen[i] + frac * (seen[(i + 1).min(seen.len() - 1)] - seen[i]);
            assert!(
                (r.threshold as f64 - want).abs() <= 1e-5 * want,
                "step {}: threshold {}, want {want}",
                r.step,
                r.threshold
            );
            assert_eq!((r.mode, r.boundary), (Mode::AutoClip, r.threshold), "{r:?}");
            assert_threshold_applied(r);
        }
        let clipped = reports.iter().filter(|r| r.clipped()).count();
        assert!(
            clipped >= 20,
            "only {clipped} of 40 steps under p10 clipped"
        );
    }

    /// ZClip has no threshold in its warm-up, then its spike boundary and
    /// threshold are those of a float64 ZClip fed the norms the steps
    /// reported, and its spikes were clipped to its threshold; switching to
    /// it again starts its warm-up again. (z = 1 so that spikes come early on
    /// every driver.)
    #[test]
    fn zclip_follows_the_float64_reference_and_restarts_on_a_switch() {
        let zclip = gradclip::ZClip::new().warmup_steps(5).z_thresh(1.0);
        let t = trainer_with(Adaptive {
            zclip,
            ..Adaptive::default()
        });
        let reports = run(&t, Mode::ZClip, 1.0, 40).unwrap();
        let (a, zt, eps) = (zclip.alpha as f64, zclip.z_thresh as f64, zclip.eps as f64);
        let warm: Vec<f64> = reports[..5].iter().map(|r| r.grad_norm as f64).collect();
        let mut mean = warm.iter().sum::<f64>() / 5.0;
        let mut var = warm.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / 5.0;
        for r in &reports {
            assert_eq!(r.mode, Mode::ZClip);
            assert_threshold_applied(r);
            if r.step <= 5 {
                assert_eq!((r.threshold, r.boundary), (f32::INFINITY, f32::INFINITY));
                continue;
            }
            let (g, sd) = (r.grad_norm as f64, var.sqrt());
            let boundary = mean + zt * (sd + eps);
            let close = |got: f32, want: f64| (got as f64 - want).abs() <= 1e-5 * want;
            assert!(
                close(r.boundary, boundary),
                "{r:?}, want boundary {boundary}"
            );
            let z = (g - mean) / (sd + eps);
            let clip_to = mean + zt * sd / (z / zt);
            if (g - boundary).abs() > 1e-5 * boundary {
                assert_eq!(r.clipped(), z > zt, "{r:?}, boundary {boundary}");
                if z > zt {
                    assert!(close(r.threshold, clip_to), "{r:?}, want {clip_to}");
                } else {
                    assert_eq!(r.threshold, f32::INFINITY, "{r:?}");
                }
            }
            let x = if r.clipped() { clip_to } else { g };
            mean = a * mean + (1.0 - a) * x;
            var = a * var + (1.0 - a) * (x - mean).powi(2);
        }
        let clipped = reports.iter().filter(|r| r.clipped()).count();
        assert!(clipped >= 2, "ZClip clipped {clipped} of 35 steps");

        run(&t, Mode::Fixed, 1.0, 1).unwrap();
        let again = run(&t, Mode::ZClip, 1.0, 6).unwrap();
        assert!(again[..5].iter().all(|r| r.boundary == f32::INFINITY));
        assert!(again[5].boundary.is_finite(), "{:?}", again[5]);
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
        let reports = run(&t, Mode::Fixed, 0.25, 150).unwrap();
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
