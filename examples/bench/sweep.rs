//! `--sweep`: what a compute shader reaches on this driver, shape by shape,
//! and what a per-chunk reduction costs: the measurements behind the
//! rooflines' defaults and behind a reduce kernel's design. Every timing
//! of one table is interleaved repetition by repetition with the others.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::chunks::{Chunks, Fold};
use crate::measure::{Bench, Buffers, Job};
use crate::roofline::{Kind, Load, Rooflines, Shape, Walk};
use crate::{candidates, date_utc, median, min_of, with_ones, Adapter, Args, Res};

#[derive(Serialize)]
struct SweepRun {
    schema: &'static str,
    date_utc: String,
    command: String,
    adapter: Adapter,
    basis: &'static str,
    reps: usize,
    warmup: usize,
    sizes: Vec<SweepSize>,
}

#[derive(Serialize)]
struct SweepSize {
    n: u64,
    shapes: Vec<ShapeResult>,
    /// The fastest shape of each kind with and without naga's runtime
    /// checks (bounds checks, loop bounding), timed together.
    runtime_checks: Vec<ShapeResult>,
    chunks: Vec<ChunkResult>,
}

#[derive(Serialize, Clone)]
struct ShapeResult {
    kind: Kind,
    shape: Shape,
    label: String,
    /// Whether naga's runtime checks were compiled in (the default).
    checked: bool,
    bytes: u64,
    seconds: f64,
    min_seconds: f64,
    gbps: f64,
    /// bytes / min_seconds: what the tables show.
    min_gbps: f64,
}

#[derive(Serialize)]
struct ChunkResult {
    k: u32,
    fold: Fold,
    walk: Walk,
    workgroup_size: u32,
    workgroups: u32,
    chunks: u32,
    seconds: f64,
    min_seconds: f64,
    gbps: f64,
    min_gbps: f64,
    /// This fold's time over the same walk's time without per-chunk folds
    /// (medians; `min_relative_to_none`: fastest repetitions).
    relative_to_none: f64,
    min_relative_to_none: f64,
    /// (this time - the no-fold time) / chunks, in microseconds (medians;
    /// `min_us_per_chunk`: fastest repetitions).
    us_per_chunk: f64,
    min_us_per_chunk: f64,
}

fn shape_results(
    kind: Kind,
    shapes: &[Shape],
    checked: &[bool],
    samples: Vec<Vec<f64>>,
    bytes: u64,
) -> Vec<ShapeResult> {
    shapes
        .iter()
        .zip(checked)
        .zip(samples)
        .map(|((shape, &checked), mut s)| {
            let seconds = median(&mut s);
            let min_seconds = min_of(&s);
            ShapeResult {
                kind,
                shape: *shape,
                label: shape.label(),
                checked,
                bytes,
                seconds,
                min_seconds,
                gbps: bytes as f64 / seconds * 1e-9,
                min_gbps: bytes as f64 / min_seconds * 1e-9,
            }
        })
        .collect()
}

pub fn run(args: &Args, bench: &Bench, adapter: Adapter, sizes: &[u64]) -> Res<()> {
    let rooflines = Rooflines::new(&bench.device, &bench.queue)?;
    let chunks = Chunks::new(&bench.device, &bench.queue)?;
    let shapes = candidates(args, &rooflines, true)?;
    let folds: Vec<Fold> = Fold::ALL
        .into_iter()
        .filter(|f| !f.needs_subgroups() || chunks.has_subgroups())
        .collect();
    let mut chunk_wgs: Vec<u32> = shapes.iter().map(|s| s.workgroup_size).collect();
    chunk_wgs.sort_unstable();
    chunk_wgs.dedup();
    eprintln!(
        "sweep: {} shapes per kind, chunk folds {:?}, chunk workgroup sizes {:?}, {} reps after {} warm-up",
        shapes.len(),
        folds.iter().map(|f| f.name()).collect::<Vec<_>>(),
        chunk_wgs,
        bench.reps,
        bench.warmup
    );
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    for &n in sizes {
        if !Rooflines::fits(&bench.device, n) {
            return Err(format!("N = {n} does not fit one binding").into());
        }
        // The values do not change the time; ones make every sum exact.
        let b = Buffers {
            n,
            pristine: bench.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("sweep pristine (unused)"),
                size: 4 * n,
                usage: wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            grads: bench.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("sweep buffer"),
                size: 4 * n,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            copy_dst: bench.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("sweep copy destination (unused)"),
                size: 4,
                usage: wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        let size = with_ones(bench, &b, || {
            sweep_size(
                bench, &rooflines, &chunks, &b, &shapes, &folds, &chunk_wgs, args,
            )
        })?;
        eprintln!(
            "N = {n} done ({:.0} s so far)",
            started.elapsed().as_secs_f64()
        );
        out.push(size);
    }
    let run = SweepRun {
        schema: "gradclip-bench-sweep/1",
        date_utc: date_utc(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        adapter,
        basis: if bench.gpu_basis { "gpu" } else { "wall" },
        reps: bench.reps,
        warmup: bench.warmup,
        sizes: out,
    };
    print!("{}", markdown(&run));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&run)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn sweep_size(
    bench: &Bench,
    rooflines: &Rooflines,
    chunks: &Chunks,
    b: &Buffers,
    shapes: &[Shape],
    folds: &[Fold],
    chunk_wgs: &[u32],
    args: &Args,
) -> Res<SweepSize> {
    let n = b.n;
    let set = &rooflines.bind(&b.grads, n, 0);
    let mut results = Vec::new();
    let mut best = Vec::new();
    for kind in [Kind::Read, Kind::Multiply] {
        rooflines.prepare(kind, shapes, true)?;
    }
    rooflines.validate(set, shapes, shapes, &[], &[], true)?;
    for kind in [Kind::Read, Kind::Multiply] {
        let jobs: Vec<Job> = shapes
            .iter()
            .map(|shape| {
                Box::new(move |pass: &mut wgpu::ComputePass| {
                    rooflines.record(set, pass, kind, shape, true)
                }) as Job
            })
            .collect();
        let samples = bench.time_jobs(&jobs, bench.reps, bench.warmup)?;
        let mut r = shape_results(
            kind,
            shapes,
            &vec![true; shapes.len()],
            samples,
            set.bytes(kind),
        );
        r.sort_by(|a, b| a.min_seconds.total_cmp(&b.min_seconds));
        eprintln!(
            "N = {n}: fastest {} {} ({:.1} GB/s fastest repetition, {:.1} median)",
            kind.name(),
            r[0].label,
            r[0].min_gbps,
            r[0].gbps
        );
        best.push((kind, r[0].shape));
        results.extend(r);
    }

    // The fastest shapes without naga's runtime checks, against themselves
    // with them, in one interleaved run.
    let mut runtime_checks = Vec::new();
    for &(kind, shape) in &best {
        let (reads, muls, powers, records) = match kind {
            Kind::Read => (vec![shape], vec![], vec![], vec![]),
            Kind::Multiply => (vec![], vec![shape], vec![], vec![]),
            Kind::Power => (vec![], vec![], vec![shape], vec![]),
            Kind::Records => (vec![], vec![], vec![], vec![shape]),
        };
        rooflines.prepare(kind, &[shape], false)?;
        rooflines.validate(set, &reads, &muls, &powers, &records, false)?;
        let jobs: Vec<Job> = [true, false]
            .into_iter()
            .map(|checked| {
                Box::new(move |pass: &mut wgpu::ComputePass| {
                    rooflines.record(set, pass, kind, &shape, checked)
                }) as Job
            })
            .collect();
        let samples = bench.time_jobs(&jobs, bench.reps, bench.warmup)?;
        runtime_checks.extend(shape_results(
            kind,
            &[shape, shape],
            &[true, false],
            samples,
            set.bytes(kind),
        ));
    }

    // Per-chunk folds: the fastest read shape's workgroup count (fewer
    // where there are fewer chunks), each workgroup size of the sweep, the
    // grid walk within a chunk and the fastest read shape's walk.
    let groups = best[0].1.workgroups;
    let mut walks = vec![Walk::Grid, best[0].1.walk];
    if walks[1] == Walk::Blocked {
        walks.pop();
    }
    walks.dedup();
    let mut chunk_results = Vec::new();
    for &wg in chunk_wgs {
        let mut sets = Vec::new();
        for &k in &args.chunk_ks {
            if k % (4 * wg) != 0 {
                eprintln!("K = {k}: not a multiple of 4 x wg{wg}; left out");
                continue;
            }
            let cs = chunks.bind(&b.grads, n, k);
            let workgroups = groups.min(cs.chunks).max(1);
            let mut pipelines = Vec::new();
            for &walk in &walks {
                if wg % walk.team() != 0 {
                    continue;
                }
                for &fold in folds {
                    let pipeline = chunks.pipeline(fold, k, wg, walk)?;
                    cs.validate(fold, &pipeline, workgroups)?;
                    pipelines.push((fold, walk, pipeline));
                }
            }
            sets.push((cs, workgroups, pipelines));
        }
        let mut jobs: Vec<Job> = Vec::new();
        for (cs, workgroups, pipelines) in &sets {
            for (_, _, pipeline) in pipelines {
                jobs.push(Box::new(move |pass: &mut wgpu::ComputePass| {
                    cs.record(pass, pipeline, *workgroups);
                    Ok(())
                }));
            }
        }
        let mut samples = bench
            .time_jobs(&jobs, bench.reps, bench.warmup)?
            .into_iter();
        for (cs, workgroups, pipelines) in &sets {
            let bytes = 16 * cs.len4;
            let timed: Vec<(Fold, Walk, f64, f64)> = pipelines
                .iter()
                .map(|(fold, walk, _)| {
                    let mut s = samples.next().expect("one sample list per job");
                    let min = min_of(&s);
                    (*fold, *walk, median(&mut s), min)
                })
                .collect();
            for &(fold, walk, seconds, min_seconds) in &timed {
                let none = timed
                    .iter()
                    .find(|t| t.0 == Fold::None && t.1 == walk)
                    .map_or((f64::NAN, f64::NAN), |t| (t.2, t.3));
                chunk_results.push(ChunkResult {
                    k: cs.k,
                    fold,
                    walk,
                    workgroup_size: wg,
                    workgroups: *workgroups,
                    chunks: cs.chunks,
                    seconds,
                    min_seconds,
                    gbps: bytes as f64 / seconds * 1e-9,
                    min_gbps: bytes as f64 / min_seconds * 1e-9,
                    relative_to_none: seconds / none.0,
                    min_relative_to_none: min_seconds / none.1,
                    us_per_chunk: (seconds - none.0) / cs.chunks as f64 * 1e6,
                    min_us_per_chunk: (min_seconds - none.1) / cs.chunks as f64 * 1e6,
                });
            }
        }
    }
    Ok(SweepSize {
        n,
        shapes: results,
        runtime_checks,
        chunks: chunk_results,
    })
}

fn gb(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "–".into()
    }
}

/// The sweep's tables: per N, the best GB/s of each (load, accumulators)
/// pair; of each (workgroup size, walk, workgroup count) for vec4 loads;
/// the ten fastest shapes; the runtime checks; the per-chunk folds.
fn markdown(run: &SweepRun) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let a = &run.adapter;
    let _ = writeln!(
        o,
        "## Roofline sweep: {} ({}, {}, driver {} {}); SUBGROUP {}, subgroup sizes {}..{}\n",
        a.name,
        a.backend,
        a.device_type,
        a.driver,
        a.driver_info,
        if a.subgroup { "yes" } else { "no" },
        a.subgroup_min_size,
        a.subgroup_max_size
    );
    let _ = writeln!(
        o,
        "{}; `{}`. {} repetitions after {} warm-up on the {} basis, every shape of a table interleaved repetition by repetition; the tables show the **fastest repetition** (load on a shared machine only adds time), medians are in the JSON and the top-ten lists. GB/s = bytes moved / time: 16 per vec4 read, 32 per vec4 multiplied.\n",
        run.date_utc, run.command, run.reps, run.warmup, run.basis
    );
    for size in &run.sizes {
        for kind in [Kind::Read, Kind::Multiply] {
            let rows: Vec<&ShapeResult> = size.shapes.iter().filter(|r| r.kind == kind).collect();
            if rows.is_empty() {
                continue;
            }
            let best_of = |f: &dyn Fn(&Shape) -> bool| {
                rows.iter()
                    .filter(|r| f(&r.shape))
                    .map(|r| r.min_gbps)
                    .fold(f64::NAN, f64::max)
            };
            let mut accs: Vec<u32> = rows.iter().map(|r| r.shape.acc).collect();
            accs.sort_unstable();
            accs.dedup();
            let _ = writeln!(
                o,
                "### N = {}: {} roofline, best GB/s per load and accumulators (over workgroup sizes, counts and walks)\n",
                size.n,
                kind.name()
            );
            let _ = write!(o, "| load |");
            for acc in &accs {
                let _ = write!(o, " acc {acc} |");
            }
            let _ = writeln!(o, "\n|---|{}", "---:|".repeat(accs.len()));
            for load in [Load::Vec4, Load::Scalar4, Load::Scalar1] {
                if !rows.iter().any(|r| r.shape.load == load) {
                    continue;
                }
                let _ = write!(o, "| {load:?} |");
                for &acc in &accs {
                    let _ = write!(o, " {} |", gb(best_of(&|s| s.load == load && s.acc == acc)));
                }
                let _ = writeln!(o);
            }
            // Workgroup size and count, for the best load.
            let load = rows[0].shape.load;
            let mut counts: Vec<u32> = rows.iter().map(|r| r.shape.workgroups).collect();
            counts.sort_unstable();
            counts.dedup();
            let mut wgs: Vec<(u32, crate::roofline::Walk)> = rows
                .iter()
                .map(|r| (r.shape.workgroup_size, r.shape.walk))
                .collect();
            wgs.sort_unstable();
            wgs.dedup();
            let _ = writeln!(
                o,
                "\n{} loads, best GB/s over accumulators, per workgroup size, walk and workgroup count:\n",
                format!("{load:?}").to_lowercase()
            );
            let _ = write!(o, "| workgroup size | walk |");
            for c in &counts {
                let _ = write!(o, " x{c} |");
            }
            let _ = writeln!(o, "\n|---:|---|{}", "---:|".repeat(counts.len()));
            for &(wg, walk) in &wgs {
                let _ = write!(o, "| {wg} | {} |", walk.name());
                for &c in &counts {
                    let _ = write!(
                        o,
                        " {} |",
                        gb(best_of(&|s| s.load == load
                            && s.workgroup_size == wg
                            && s.walk == walk
                            && s.workgroups == c))
                    );
                }
                let _ = writeln!(o);
            }
            let _ = writeln!(o, "\nFastest ten:\n");
            let _ = writeln!(
                o,
                "| shape | GB/s (fastest) | GB/s (median) | min µs | median µs |"
            );
            let _ = writeln!(o, "|---|---:|---:|---:|---:|");
            for r in rows.iter().take(10) {
                let _ = writeln!(
                    o,
                    "| {} | {:.1} | {:.1} | {:.0} | {:.0} |",
                    r.label,
                    r.min_gbps,
                    r.gbps,
                    r.min_seconds * 1e6,
                    r.seconds * 1e6
                );
            }
            let slowest = rows[rows.len() - 1];
            let _ = writeln!(
                o,
                "\nSlowest: {} at {:.1} GB/s ({} shapes).\n",
                slowest.label,
                slowest.min_gbps,
                rows.len()
            );
        }
        if !size.runtime_checks.is_empty() {
            let _ = writeln!(
                o,
                "### N = {}: naga's runtime checks (bounds checks, loop bounding) on the fastest shapes\n",
                size.n
            );
            let _ = writeln!(
                o,
                "| kind | shape | checked GB/s | unchecked GB/s | unchecked / checked time (fastest) | (median) |"
            );
            let _ = writeln!(o, "|---|---|---:|---:|---:|---:|");
            for pair in size.runtime_checks.chunks(2) {
                if let [c, u] = pair {
                    let _ = writeln!(
                        o,
                        "| {} | {} | {:.1} | {:.1} | {:.3} | {:.3} |",
                        c.kind.name(),
                        c.label,
                        c.min_gbps,
                        u.min_gbps,
                        u.min_seconds / c.min_seconds,
                        u.seconds / c.seconds
                    );
                }
            }
            let _ = writeln!(o);
        }
        if !size.chunks.is_empty() {
            let mut folds: Vec<Fold> = Vec::new();
            for c in &size.chunks {
                if !folds.contains(&c.fold) {
                    folds.push(c.fold);
                }
            }
            let _ = writeln!(
                o,
                "### N = {}: a fold per chunk of K elements (vec4 loads, {} accumulators)\n\nGB/s of each fold; in brackets its time / the same walk without per-chunk folds (\"none\"), and the extra µs per chunk.\n",
                size.n,
                crate::chunks::ACC
            );
            let _ = write!(o, "| workgroup size | walk | K | chunks | workgroups |");
            for f in &folds {
                let _ = write!(o, " {} |", f.name());
            }
            let _ = writeln!(
                o,
                "\n|---:|---|---:|---:|---:|{}",
                "---:|".repeat(folds.len())
            );
            let mut rows: BTreeMap<(u32, Walk, u32), Vec<&ChunkResult>> = BTreeMap::new();
            for c in &size.chunks {
                rows.entry((c.workgroup_size, c.walk, c.k))
                    .or_default()
                    .push(c);
            }
            for ((wg, walk, k), cs) in rows {
                let _ = write!(
                    o,
                    "| {wg} | {} | {k} | {} | {} |",
                    walk.name(),
                    cs[0].chunks,
                    cs[0].workgroups
                );
                for f in &folds {
                    match cs.iter().find(|c| c.fold == *f) {
                        Some(c) if c.fold == Fold::None => {
                            let _ = write!(o, " {:.1} |", c.min_gbps);
                        }
                        Some(c) => {
                            let _ = write!(
                                o,
                                " {:.1} ({:.2}x, {:+.2} µs) |",
                                c.min_gbps, c.min_relative_to_none, c.min_us_per_chunk
                            );
                        }
                        None => {
                            let _ = write!(o, " – |");
                        }
                    }
                }
                let _ = writeln!(o);
            }
            let _ = writeln!(o);
        }
    }
    o
}
