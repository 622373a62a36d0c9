//! The markdown tables printed on stdout.

use std::collections::BTreeMap;

use crate::{CaseResult, NormKind, Run, Step};

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

/// A row's reduce time: the reduce pass, or reduce+finalize where the
/// device has no timestamps inside passes.
pub fn reduce_seconds(r: &CaseResult) -> Option<f64> {
    REDUCE_PASSES.iter().find_map(|n| r.passes.get(*n).copied())
}

/// The passes a row's reduce time or fraction is read from, in order.
pub const REDUCE_PASSES: [&str; 2] = ["reduce", "reduce+finalize"];

/// The row of one case and implementation.
pub fn row<'a>(
    run: &'a Run,
    implementation: &str,
    n: u64,
    tensors: usize,
    norm: NormKind,
    step: Step,
) -> Option<&'a CaseResult> {
    run.results.iter().find(|r| {
        r.implementation == implementation
            && r.n == n
            && r.tensors == tensors
            && r.norm == norm
            && r.step == step
    })
}

/// The least a step with tensor norms could take over the plain step
/// `plain`: its time with its reduce replaced by the records roofline's
/// measured beside the tensor-norms row `tn`.
pub fn records_floor(plain: &CaseResult, tn: &CaseResult) -> Option<f64> {
    Some((plain.seconds - reduce_seconds(plain)? + tn.records_roofline_seconds?) / plain.seconds)
}

/// The least a general p's step `p` could take over the L2 step `l2` of
/// the same case: its time with its reduce replaced by the power
/// roofline's (the read with |x|^p summed), measured in the same
/// repetitions. None where the row has no power roofline (L2, Inf, an
/// integer p).
pub fn power_floor(p: &CaseResult, l2: &CaseResult) -> Option<f64> {
    let power_seconds = 4.0 * p.n as f64 / (p.power_roofline_gbps? * 1e9);
    Some((p.seconds - reduce_seconds(p)? + power_seconds) / l2.seconds)
}

fn percent(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{}%", sig(100.0 * v)))
}

/// A pass's fraction of its roofline in a row's `fractions` (its medians'
/// or its fastest repetitions'), the first of `names` it has: reduce (or
/// reduce+finalize) and naive norms against the read roofline, scale
/// against the multiply one.
pub fn pass_fraction(fractions: &BTreeMap<String, f64>, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| fractions.get(*n).copied())
}

/// A pass's fraction as "median (fastest, paired)".
fn pass_percent(r: &CaseResult, names: &[&str]) -> String {
    match pass_fraction(&r.pass_roofline_fractions, names) {
        Some(v) => format!(
            "{} ({}, {})",
            percent(Some(v)),
            percent(pass_fraction(&r.pass_roofline_fractions_fastest, names)),
            percent(pass_fraction(&r.pass_roofline_fractions_paired, names))
        ),
        None => "–".into(),
    }
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
    if !run.rooflines.is_empty() {
        let _ = writeln!(
            o,
            "\n### Rooflines (what a compute shader reaches here)\n\nThe fastest of the candidate shapes of each kind (by the fastest repetition of a short interleaved tuning run; all of them are in the JSON's `tried`), then timed in every case's repetitions like the copy; GB/s is the median over the cases of each N. Read: a sum of vec4 loads, 16 bytes per vec4. Multiply: in place, 16 read + 16 written. Step roofline: the effective GB/s of a clip step whose 4 N bytes read go at the read roofline and 8 N at the multiply roofline. Power (where a case has a general p): the read with |x|^p summed, the floor of a general p's reduce; power / read is its time over the read's.\n"
        );
        let _ = writeln!(
            o,
            "| N | read GB/s | read shape | multiply GB/s | multiply shape | read / copy | multiply / copy | clip-step roofline GB/s | power GB/s | power shape | power / read | candidates |"
        );
        let _ = writeln!(
            o,
            "|---:|---:|---|---:|---|---:|---:|---:|---:|---|---:|---:|"
        );
        for r in &run.rooflines {
            let copy = run
                .copy
                .iter()
                .find(|c| c.n == r.n)
                .map_or(f64::NAN, |c| c.gbps);
            let step = 12.0 / (4.0 / r.read.gbps + 8.0 / r.multiply.gbps);
            let (power_gbps, power_shape, power_over_read) = match &r.power {
                Some(p) => (
                    format!("{:.1}", p.gbps),
                    p.label.clone(),
                    sig(r.read.gbps / p.gbps),
                ),
                None => ("–".into(), "–".into(), "–".into()),
            };
            let _ = writeln!(
                o,
                "| {} | {:.1} | {} | {:.1} | {} | {} | {} | {:.1} | {} | {} | {} | {} |",
                r.n,
                r.read.gbps,
                r.read.label,
                r.multiply.gbps,
                r.multiply.label,
                sig(r.read.gbps / copy),
                sig(r.multiply.gbps / copy),
                step,
                power_gbps,
                power_shape,
                power_over_read,
                r.tried
                    .iter()
                    .filter(|t| t.kind == crate::roofline::Kind::Read)
                    .count()
            );
        }
        // On the H200 wgpu's buffer copy ran at 0.85 TB/s while compute
        // kernels moved 4 TB/s: `% copy` then reads far above 100%.
        let slow_copy: Vec<u64> = run
            .rooflines
            .iter()
            .filter(|r| {
                run.copy
                    .iter()
                    .any(|c| c.n == r.n && r.multiply.gbps > 1.25 * c.gbps)
            })
            .map(|r| r.n)
            .collect();
        if !slow_copy.is_empty() {
            let _ = writeln!(
                o,
                "\n**The device copy is no limit on this adapter** (N = {slow_copy:?}): the multiply roofline, which moves the same bytes, runs more than 1.25× faster than `copy_buffer_to_buffer`. Read `% roof`, not `% copy`."
            );
        }
        if run.rooflines.iter().any(|r| !r.records.is_empty()) {
            let _ = writeln!(
                o,
                "\nRecords (cases with tensor norms): the read writing one 16-byte record per tensor, tuned per tensor count over the read's vec4 candidates, the floor of a reduce with per-tensor results; bytes = 16 (N / 4) read + 16 per record written, GB/s and µs the median over the case's norms and steps; records / read: its time over the read roofline's (each the median over its cases).\n"
            );
            let _ = writeln!(
                o,
                "| N | tensors (records) | records GB/s | records µs | read µs | records / read | records shape | candidates |"
            );
            let _ = writeln!(o, "|---:|---:|---:|---:|---:|---:|---|---:|");
            for r in &run.rooflines {
                for k in &r.records {
                    let _ = writeln!(
                        o,
                        "| {} | {} | {:.1} | {} | {} | {} | {} | {} |",
                        r.n,
                        k.tensors,
                        k.kernel.gbps,
                        us(k.kernel.seconds),
                        us(r.read.seconds),
                        sig(k.kernel.seconds / r.read.seconds),
                        k.kernel.label,
                        k.tried.len()
                    );
                }
            }
        }
    }
    let _ = writeln!(
        o,
        "\n### Clip steps and no-clip steps\n\nGB/s = floor bytes (12 N for a clip, 4 N for no clip) / time; % copy = that / the copy bandwidth measured in the same case's repetitions (host copy for the CPU rows); % roof = the time the rooflines of the same repetitions need for those bytes / this time. Every repetition runs copy, gradclip (and gradclip-tensor-norms, and beside a p norm a plain L2 step), the rooflines, naive and cpu in turn, so load changes hit them alike. Passes: gradclip reduce / finalize / gap (from finalize's end to the scale pass's start) / scale, naive norms / total / scale; reduce % and scale % are those passes against the read and multiply rooflines, median against median, and in brackets each pass's fastest repetition against each roofline's fastest (steadier where a driver's repetitions of a pass spread widely, as SwiftShader's read-only passes do, up to 2x). e2e = record + submit + wait on the host.\n"
    );
    let _ = writeln!(
        o,
        "| N | tensors | norm | step | impl | time µs | GB/s | % copy | % roof | reduce % / scale % | passes µs | e2e µs | record µs |"
    );
    let _ = writeln!(
        o,
        "|---:|---:|---|---|---|---:|---:|---:|---:|---|---|---:|---:|"
    );
    for r in &run.results {
        let passes = match r.implementation.as_str() {
            "gradclip" | "gradclip-tensor-norms" if r.passes.contains_key("reduce") => format!(
                "{} / {} / {} / {}",
                pass(r, "reduce"),
                pass(r, "finalize"),
                pass(r, "gap"),
                pass(r, "scale")
            ),
            "gradclip" | "gradclip-tensor-norms" if !r.passes.is_empty() => format!(
                "{} (reduce+finalize) / {} / {}",
                pass(r, "reduce+finalize"),
                pass(r, "gap"),
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
        let fractions = if r.pass_roofline_fractions.is_empty() {
            "–".into()
        } else {
            format!(
                "{} / {}",
                pass_percent(r, &["reduce", "reduce+finalize", "norms"]),
                pass_percent(r, &["scale"])
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {}% | {} | {} | {} | {} | {} |",
            r.n,
            r.tensors,
            r.norm,
            r.step.name(),
            r.implementation,
            us(r.seconds),
            sig(r.gbps),
            sig(100.0 * r.copy_fraction),
            percent(r.roofline_fraction),
            fractions,
            passes,
            us(r.wall_seconds),
            r.record_seconds.map_or("–".into(), us)
        );
    }
    // Ratios between implementations of the same case, from this run.
    let find = |imp: &str, g: &CaseResult| row(run, imp, g.n, g.tensors, g.norm, g.step);
    let l2 = |g: &CaseResult| row(run, "gradclip", g.n, g.tensors, NormKind::L2, g.step);
    let _ = writeln!(
        o,
        "\n### gradclip against its limits and baselines (same run)\n\n% roof: the step against the rooflines (read for a no-clip step, read + multiply for a clip step); reduce % read and scale % multiply: those passes against the rooflines (reduce+finalize where the device has no timestamps inside passes), median against median, and in brackets fastest repetition against fastest, and paired (the median over the repetitions of each repetition's own ratio, which a host that slows down for seconds at a time moves least); tensor norms / plain: the same clip with `tensor_norms(true)` / without, medians, and in brackets paired; / L2: this norm's time / the L2 time of the same case, and in brackets for a p norm paired with the plain L2 step timed in the same repetitions; general p only, reduce % power: the reduce against the power roofline (|x|^p summed), and power / read: that roofline's time / the read roofline's, the least a general p's reduce can take over the read (against / L2); with tensor norms, records / read: the records roofline's time (the read writing one 16-byte record per tensor) / the read roofline's, floor / plain: (the plain step's time − its reduce + the records roofline's time) / the plain step's time, the least a step with tensor norms could take over the plain one if only its reduce changed and ran at the records roofline (against tensor norms / plain), and reduce % records: the records roofline's time / the tensor-norms step's reduce. Baseline ratios: their time / gradclip's (above 1: gradclip is faster).\n"
    );
    let _ = writeln!(
        o,
        "| N | tensors | norm | step | % copy | % roof | reduce % read (fastest, paired) | scale % multiply (fastest, paired) | tensor norms / plain (paired) | records / read | tensor norms floor / plain | reduce % records | / L2 | reduce % power | power / read | naive / gradclip | naive record / gradclip record | cpu / gradclip (wall) |"
    );
    let _ = writeln!(
        o,
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for g in run
        .results
        .iter()
        .filter(|r| r.implementation == "gradclip")
    {
        let naive = find("naive", g);
        let cpu = find("cpu", g);
        let tn = find("gradclip-tensor-norms", g);
        // The plain step with its reduce at the records roofline.
        let floor = tn.and_then(|t| records_floor(g, t));
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {}% | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            g.n,
            g.tensors,
            g.norm,
            g.step.name(),
            sig(100.0 * g.copy_fraction),
            percent(g.roofline_fraction),
            pass_percent(g, &REDUCE_PASSES),
            pass_percent(g, &["scale"]),
            tn.map_or("–".into(), |r| format!(
                "{} ({})",
                sig(r.seconds / g.seconds),
                r.over_plain_paired.map_or("–".into(), sig)
            )),
            tn.and_then(|r| r.records_over_read).map_or("–".into(), sig),
            floor.map_or("–".into(), sig),
            percent(tn.and_then(|r| r.reduce_records_fraction)),
            l2(g).map_or("–".into(), |r| match g.over_l2_paired {
                Some(p) => format!("{} ({})", sig(g.seconds / r.seconds), sig(p)),
                None => sig(g.seconds / r.seconds),
            }),
            percent(g.reduce_power_fraction),
            match (g.read_roofline_gbps, g.power_roofline_gbps) {
                (Some(read), Some(power)) => sig(read / power),
                _ => "–".into(),
            },
            naive.map_or("–".into(), |r| sig(r.seconds / g.seconds)),
            naive
                .and_then(|r| Some(r.record_seconds? / g.record_seconds?))
                .map_or("–".into(), sig),
            cpu.map_or("–".into(), |r| sig(r.wall_seconds / g.wall_seconds)),
        );
    }
    if let Some(targets) = crate::targets::table(run) {
        o.push_str(&targets);
    }
    o
}
