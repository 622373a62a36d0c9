//! The markdown tables printed on stdout.

use crate::{CaseResult, Run};

pub fn plot_title(run: &Run) -> String {
    format!(
        "gradclip clip_norm, {} ({}), {}",
        run.adapter.name, run.adapter.backend, run.date_utc
    )
}

fn us(s: f64) -> String {
    let v = s * 1e6;
    if !v.is_finite() {
        "–".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Three significant digits, no exponent.
fn sig(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let digits = (2 - v.abs().max(1e-9).log10().floor() as i32).clamp(0, 9) as usize;
    format!("{v:.digits$}")
}

fn pass(r: &CaseResult, name: &str) -> String {
    r.passes.get(name).map_or("–".into(), |&s| us(s))
}

/// The results as markdown tables.
pub fn markdown(run: &Run) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let a = &run.adapter;
    let _ = writeln!(
        o,
        "## gradclip benchmark: {} ({}, {}, driver {} {})\n",
        a.name, a.backend, a.device_type, a.driver, a.driver_info
    );
    let _ = writeln!(
        o,
        "{}; `{}`. Median of {} repetitions after {} warm-up; times in µs on the {} basis ({}).\n",
        run.date_utc,
        run.command,
        run.reps,
        run.warmup,
        run.basis,
        if run.basis == "gpu" {
            "GPU timestamps from the first pass's start to the last pass's end"
        } else {
            "wall clock around submit + wait"
        }
    );
    let _ = writeln!(
        o,
        "### Copy bandwidth (the limit)\n\nEach case times a copy of the whole buffer in every repetition, between its clips; this is the median over the cases of each N.\n"
    );
    let _ = writeln!(
        o,
        "| N | bytes moved | device copy µs | device GB/s | host copy GB/s |"
    );
    let _ = writeln!(o, "|---:|---:|---:|---:|---:|");
    for c in &run.copy {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.1} | {} |",
            c.n,
            c.bytes,
            us(c.seconds),
            c.gbps,
            c.host_gbps.map_or("–".into(), |g| format!("{g:.1}"))
        );
    }
    let _ = writeln!(
        o,
        "\n### Clip steps and no-clip steps\n\nGB/s = floor bytes (12 N for a clip, 4 N for no clip) / time; % copy = that / the copy bandwidth measured in the same case's repetitions (host copy for the CPU rows). Every repetition runs copy, gradclip, naive and cpu in turn, so load changes hit them alike. Passes: gradclip reduce / finalize / indirect-args copy / scale, naive norms / total / scale. e2e = record + submit + wait on the host.\n"
    );
    let _ = writeln!(
        o,
        "| N | tensors | norm | step | impl | time µs | GB/s | % copy | passes µs | e2e µs | record µs |"
    );
    let _ = writeln!(o, "|---:|---:|---|---|---|---:|---:|---:|---|---:|---:|");
    for r in &run.results {
        let passes = match r.implementation.as_str() {
            "gradclip" if r.passes.contains_key("reduce") => format!(
                "{} / {} / {} / {}",
                pass(r, "reduce"),
                pass(r, "finalize"),
                pass(r, "args_copy"),
                pass(r, "scale")
            ),
            "gradclip" if !r.passes.is_empty() => format!(
                "{} (reduce+finalize) / {} / {}",
                pass(r, "reduce+finalize"),
                pass(r, "args_copy"),
                pass(r, "scale")
            ),
            "naive" if !r.passes.is_empty() => format!(
                "{} / {} / {}",
                pass(r, "norms"),
                pass(r, "total"),
                pass(r, "scale")
            ),
            _ => "–".into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {}% | {} | {} | {} |",
            r.n,
            r.tensors,
            r.norm,
            r.step.name(),
            r.implementation,
            us(r.seconds),
            sig(r.gbps),
            sig(100.0 * r.copy_fraction),
            passes,
            us(r.wall_seconds),
            r.record_seconds.map_or("–".into(), us)
        );
    }
    // Ratios between implementations of the same case, from this run.
    let find = |imp: &str, g: &CaseResult| {
        run.results.iter().find(|r| {
            r.implementation == imp
                && r.n == g.n
                && r.tensors == g.tensors
                && r.norm == g.norm
                && r.step == g.step
        })
    };
    let _ = writeln!(
        o,
        "\n### Ratios (same run)\n\nTime of each baseline / gradclip's time (above 1: gradclip is faster); record time likewise.\n"
    );
    let _ = writeln!(
        o,
        "| N | tensors | norm | step | gradclip % copy | naive / gradclip | naive record / gradclip record | cpu / gradclip (wall) |"
    );
    let _ = writeln!(o, "|---:|---:|---|---|---:|---:|---:|---:|");
    for g in run
        .results
        .iter()
        .filter(|r| r.implementation == "gradclip")
    {
        let naive = find("naive", g);
        let cpu = find("cpu", g);
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {}% | {} | {} | {} |",
            g.n,
            g.tensors,
            g.norm,
            g.step.name(),
            sig(100.0 * g.copy_fraction),
            naive.map_or("–".into(), |r| sig(r.seconds / g.seconds)),
            naive
                .and_then(|r| Some(r.record_seconds? / g.record_seconds?))
                .map_or("–".into(), sig),
            cpu.map_or("–".into(), |r| sig(r.wall_seconds / g.wall_seconds)),
        );
    }
    o
}
