//! The SVG plot: effective GB/s against N, one panel per tensor count, with
//! the device's copy bandwidth and the rooflines as the lines to reach.

use std::path::Path;

use plotters::prelude::*;

use crate::{NormKind, Run, Step};

/// (implementation, norm, step, label, colour) of each plotted series.
const SERIES: &[(&str, NormKind, Step, &str, RGBColor)] = &[
    (
        "gradclip",
        NormKind::L2,
        Step::Clip,
        "gradclip L2 clip",
        RGBColor(31, 119, 180),
    ),
    (
        "gradclip",
        NormKind::L2,
        Step::Noclip,
        "gradclip L2 no-clip",
        RGBColor(23, 190, 207),
    ),
    (
        "gradclip",
        NormKind::Inf,
        Step::Clip,
        "gradclip Inf clip",
        RGBColor(44, 160, 44),
    ),
    (
        "gradclip",
        NormKind::Inf,
        Step::Noclip,
        "gradclip Inf no-clip",
        RGBColor(152, 223, 138),
    ),
    (
        "gradclip-tensor-norms",
        NormKind::L2,
        Step::Clip,
        "gradclip L2 clip, tensor norms",
        RGBColor(140, 86, 75),
    ),
    (
        "naive",
        NormKind::L2,
        Step::Clip,
        "per-tensor dispatches L2 clip",
        RGBColor(214, 39, 40),
    ),
    (
        "cpu",
        NormKind::L2,
        Step::Clip,
        "CPU loop L2 clip (wall)",
        RGBColor(148, 103, 189),
    ),
    (
        "torch",
        NormKind::L2,
        Step::Clip,
        "torch L2 clip",
        RGBColor(255, 127, 14),
    ),
];
const COPY_COLOUR: RGBColor = RGBColor(90, 90, 90);
const READ_ROOF_COLOUR: RGBColor = RGBColor(160, 160, 160);
const CLIP_ROOF_COLOUR: RGBColor = RGBColor(0, 0, 0);
const LEGEND_WIDTH: u32 = 250;

/// "1e5" at powers of ten, nothing between them (log axes get a label at
/// every minor tick otherwise).
fn decade_label(v: f64) -> String {
    let e = v.log10().round();
    if (v / 10f64.powf(e) - 1.0).abs() > 1e-6 {
        String::new()
    } else if (-2.0..=3.0).contains(&e) {
        format!("{}", 10f64.powf(e))
    } else {
        format!("1e{e}")
    }
}

pub fn svg(run: &Run, title: &str, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let (copies, results) = (&run.copy, &run.results);
    // The rooflines as effective GB/s: a no-clip step at the read roofline,
    // a clip step with 4 N bytes at the read and 8 N at the multiply one.
    let read_roof: Vec<(f64, f64)> = run
        .rooflines
        .iter()
        .map(|r| (r.n as f64, r.read.gbps))
        .collect();
    let clip_roof: Vec<(f64, f64)> = run
        .rooflines
        .iter()
        .map(|r| {
            (
                r.n as f64,
                12.0 / (4.0 / r.read.gbps + 8.0 / r.multiply.gbps),
            )
        })
        .collect();
    let mut tensor_counts: Vec<usize> = results.iter().map(|r| r.tensors).collect();
    tensor_counts.sort_unstable();
    tensor_counts.dedup();
    if tensor_counts.is_empty() {
        return Err("nothing to plot".into());
    }
    let xs = copies.iter().map(|c| c.n as f64);
    let (x_min, x_max) = xs.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let ys = results
        .iter()
        .map(|r| r.gbps)
        .chain(copies.iter().map(|c| c.gbps))
        .chain(read_roof.iter().chain(&clip_roof).map(|p| p.1))
        .filter(|y| y.is_finite() && *y > 0.0);
    let (y_min, y_max) = ys.fold((f64::INFINITY, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
    let (x_min, x_max) = (x_min / 1.5, x_max * 1.5);
    let (y_min, y_max) = (y_min / 2.0, y_max * 2.0);

    let width = 480 * tensor_counts.len() as u32 + LEGEND_WIDTH;
    let root = SVGBackend::new(path, (width, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let (plots, legend) = root.split_horizontally(width - LEGEND_WIDTH);
    let panels = plots.split_evenly((1, tensor_counts.len()));
    let mut drawn: Vec<(&str, RGBColor, u32)> =
        vec![("device copy (read + write)", COPY_COLOUR, 3)];
    if !read_roof.is_empty() {
        drawn.push(("read roofline (no-clip step limit)", READ_ROOF_COLOUR, 3));
        drawn.push((
            "read + multiply roofline (clip step limit)",
            CLIP_ROOF_COLOUR,
            1,
        ));
    }
    for (panel, &t) in panels.iter().zip(&tensor_counts) {
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{t} tensor{}", if t == 1 { "" } else { "s" }),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d((x_min..x_max).log_scale(), (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("N (f32 elements)")
            .y_desc("effective GB/s (floor bytes / time)")
            .x_label_formatter(&|x| decade_label(*x))
            .y_label_formatter(&|y| decade_label(*y))
            .light_line_style(RGBColor(238, 238, 238))
            .bold_line_style(RGBColor(200, 200, 200))
            .draw()?;

        let copy: Vec<(f64, f64)> = copies.iter().map(|c| (c.n as f64, c.gbps)).collect();
        chart.draw_series(LineSeries::new(copy, COPY_COLOUR.stroke_width(3)))?;
        if !read_roof.is_empty() {
            chart.draw_series(LineSeries::new(
                read_roof.clone(),
                READ_ROOF_COLOUR.stroke_width(3),
            ))?;
            chart.draw_series(LineSeries::new(
                clip_roof.clone(),
                CLIP_ROOF_COLOUR.stroke_width(1),
            ))?;
        }

        for &(imp, norm, step, label, colour) in SERIES {
            let mut points: Vec<(f64, f64)> = results
                .iter()
                .filter(|r| {
                    r.implementation == imp
                        && r.norm == norm
                        && r.step == step
                        && r.tensors == t
                        && r.gbps.is_finite()
                })
                .map(|r| (r.n as f64, r.gbps))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?;
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
            if !drawn.iter().any(|d| d.0 == label) {
                drawn.push((label, colour, 2));
            }
        }
    }
    // The legend, in its own column so that it never hides a point.
    for (k, &(label, colour, width)) in drawn.iter().enumerate() {
        let y = 60 + 24 * k as i32;
        legend.draw(&PathElement::new(
            vec![(8, y), (36, y)],
            colour.stroke_width(width),
        ))?;
        legend.draw(&Text::new(label, (44, y - 7), ("sans-serif", 13)))?;
    }
    root.present()?;
    Ok(())
}
