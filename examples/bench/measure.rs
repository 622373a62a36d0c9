//! Timing: the device, its timestamp queries, and one case measured with
//! every implementation interleaved repetition by repetition, so that a
//! change in the machine's load (it is shared) hits all of them alike and
//! the ratios stay meaningful even when the absolute times drift.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::roofline::{Kind, RooflineSet, Rooflines, Shape};
use crate::{cpu, naive, NormKind, Res};

/// Timestamp queries per repetition of each implementation, and where each
/// implementation's region of the query set starts (in units of `reps`).
const GRADCLIP_STAMPS: u32 = gradclip::GradSet::CLIP_TIMESTAMPS;
const NAIVE_STAMPS: u32 = naive::TIMESTAMPS;
const COPY_STAMPS: u32 = 2;
/// Begin and end of the read roofline's pass, then of the multiply's.
const ROOFLINE_STAMPS: u32 = 4;
/// Begin and end of the power roofline's pass: a region of its own, read
/// back only in the general p cases that write it.
const POWER_STAMPS: u32 = 2;
/// Begin and end of the records roofline's pass: a region of its own, read
/// back only in the cases that time it (those with tensor norms).
const RECORDS_STAMPS: u32 = 2;
/// Written around the plain `clip_norm` of --whole-step: the step as
/// users record it, without clip_norm_timed's timestamps between passes.
const WHOLE_STAMPS: u32 = 2;
const GRADCLIP_REGION: u32 = 0;
const TENSOR_NORMS_REGION: u32 = GRADCLIP_REGION + GRADCLIP_STAMPS;
const NAIVE_REGION: u32 = TENSOR_NORMS_REGION + GRADCLIP_STAMPS;
const COPY_REGION: u32 = NAIVE_REGION + NAIVE_STAMPS;
const ROOFLINE_REGION: u32 = COPY_REGION + COPY_STAMPS;
const POWER_REGION: u32 = ROOFLINE_REGION + ROOFLINE_STAMPS;
const RECORDS_REGION: u32 = POWER_REGION + POWER_STAMPS;
const WHOLE_REGION: u32 = RECORDS_REGION + RECORDS_STAMPS;
const L2_REGION: u32 = WHOLE_REGION + WHOLE_STAMPS;
/// Queries one repetition of a case can write.
pub const STAMPS_PER_REP: u32 = L2_REGION + GRADCLIP_STAMPS;

/// Each repetition's time, in seconds, from stamp `begin` to stamp
/// `begin + 1` of its `per_rep` stamps (nanoseconds).
fn spans(stamps: &[f64], per_rep: usize, begin: usize) -> Vec<f64> {
    stamps
        .chunks_exact(per_rep)
        .map(|p| (p[begin + 1] - p[begin]) * 1e-9)
        .collect()
}

/// The device and what every measurement shares.
pub struct Bench {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// Pass timestamps (Features::TIMESTAMP_QUERY), unless --wall.
    pub timestamps: bool,
    /// Timestamps between commands too (TIMESTAMP_QUERY_INSIDE_ENCODERS):
    /// the copy is timed on the GPU, and every GPU result is on that basis.
    pub gpu_basis: bool,
    /// Timestamps inside passes: reduce and finalize are timed apart.
    pub inside_passes: bool,
    pub period_ns: f64,
    pub queries: Option<wgpu::QuerySet>,
    pub resolve: Option<wgpu::Buffer>,
    pub readback: Option<wgpu::Buffer>,
    pub reps: usize,
    pub warmup: usize,
}

/// The buffers of one size N.
pub struct Buffers {
    pub n: u64,
    pub pristine: wgpu::Buffer,
    pub grads: wgpu::Buffer,
    pub copy_dst: wgpu::Buffer,
}

/// Per-repetition samples of one implementation in one case.
pub struct Samples {
    pub wall: Vec<f64>,
    pub record: Vec<f64>,
    pub passes: BTreeMap<String, Vec<f64>>,
    pub gpu_total: Vec<f64>,
}

impl Samples {
    fn new(reps: usize) -> Self {
        Self {
            wall: Vec::with_capacity(reps),
            record: Vec::with_capacity(reps),
            passes: BTreeMap::new(),
            gpu_total: Vec::new(),
        }
    }

    /// Splits each repetition's `per_rep` timestamps into passes: `names[k]`
    /// is the time from stamp k to stamp k + 1 (None: not reported); the GPU
    /// total runs from the first stamp to the last.
    fn add_stamps(&mut self, stamps: &[f64], per_rep: usize, names: &[Option<&str>]) {
        for rep in stamps.chunks_exact(per_rep) {
            for (k, name) in names.iter().enumerate() {
                if let Some(name) = name {
                    self.passes
                        .entry(name.to_string())
                        .or_default()
                        .push((rep[k + 1] - rep[k]) * 1e-9);
                }
            }
            self.gpu_total.push((rep[per_rep - 1] - rep[0]) * 1e-9);
        }
    }
}

/// The CPU baseline's inputs: pristine values, a work copy, the tensors.
pub struct CpuCase<'a> {
    pub host: &'a [f32],
    pub work: &'a mut [f32],
    pub ranges: &'a [std::ops::Range<usize>],
}

/// The rooflines of one case: the bound buffer and the shapes to time.
pub struct RooflineCase<'a> {
    pub rooflines: &'a Rooflines,
    pub set: &'a RooflineSet,
    pub read: Shape,
    pub multiply: Shape,
    /// The power kernel's shape and the case's p, in a general p's case.
    pub power: Option<(Shape, f32)>,
    /// The records kernel's shape and record count (the case's tensors),
    /// where the case times gradclip with tensor norms.
    pub records: Option<(Shape, u32)>,
}

/// One case: the same clip by every implementation that runs it.
pub struct CaseInputs<'a> {
    pub buffers: &'a Buffers,
    pub set: &'a gradclip::GradSet,
    /// Also time the clip with `tensor_norms(true)`, in the same repetitions.
    pub tensor_norms: bool,
    /// Also time the plain `clip_norm` between two encoder timestamps
    /// (needs the GPU basis), in the same repetitions.
    pub whole_step: bool,
    pub roofline: Option<RooflineCase<'a>>,
    /// Also time the plain clip with the L2 norm and this max_norm, in the
    /// same repetitions: a p case's step over L2's, paired by repetition
    /// (the L2 case itself runs before or after, on a host that may have
    /// changed speed since).
    pub l2_beside: Option<f32>,
    pub naive: Option<(&'a naive::Naive, &'a naive::NaiveSet)>,
    pub cpu: Option<CpuCase<'a>>,
    pub norm: NormKind,
    pub max_norm: f32,
}

/// What one case measured; (norm, coefficient) of each implementation's
/// last repetition, for the checks.
pub struct CaseSamples {
    pub gradclip: (Samples, (f32, f32)),
    /// The `tensor_norms(true)` clip, with its last report's tensor norms.
    pub tensor_norms: Option<(Samples, (f32, f32), Vec<f32>)>,
    /// The plain `clip_norm`, timed whole (--whole-step).
    pub whole_step: Option<(Samples, (f32, f32))>,
    /// The plain L2 clip of `l2_beside`.
    pub l2_beside: Option<(Samples, (f32, f32))>,
    /// Read and multiply roofline times, on the run's basis.
    pub read_roofline: Vec<f64>,
    pub multiply_roofline: Vec<f64>,
    /// Power roofline times (general p cases; else empty).
    pub power_roofline: Vec<f64>,
    /// Records roofline times (cases with tensor norms; else empty).
    pub records_roofline: Vec<f64>,
    pub naive: Option<(Samples, (f32, f32))>,
    pub cpu: Option<(Samples, (f32, f32))>,
    /// Device copy of the whole buffer, on the run's basis.
    pub copy: Vec<f64>,
    /// Host copy of the whole buffer (the CPU baseline's restore, timed).
    pub host_copy: Vec<f64>,
}

impl Bench {
    fn encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    fn wait(&self) -> Res<()> {
        self.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok(())
    }

    /// Puts the pristine gradients back (untimed) and waits for it.
    pub fn restore(&self, b: &Buffers) -> Res<()> {
        let mut enc = self.encoder("bench restore gradients");
        enc.copy_buffer_to_buffer(&b.pristine, 0, &b.grads, 0, b.n * 4);
        self.queue.submit([enc.finish()]);
        self.wait()
    }

    /// Timestamps `first .. first + count` of the query set, in nanoseconds.
    fn read_timestamps(&self, first: u32, count: u32) -> Res<Vec<f64>> {
        let (Some(queries), Some(resolve), Some(readback)) =
            (&self.queries, &self.resolve, &self.readback)
        else {
            return Ok(Vec::new());
        };
        let mut enc = self.encoder("bench resolve timestamps");
        enc.resolve_query_set(queries, first..first + count, resolve, 0);
        enc.copy_buffer_to_buffer(resolve, 0, readback, 0, count as u64 * 8);
        self.queue.submit([enc.finish()]);
        let bytes = crate::read_mapped(&self.device, readback)?;
        Ok(bytes[..count as usize * 8]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as f64 * self.period_ns)
            .collect())
    }

    /// First query of repetition `r` in a region (warm-ups share the first).
    fn slot(&self, region: u32, per_rep: u32, r: usize) -> u32 {
        region * self.reps as u32 + r.saturating_sub(self.warmup) as u32 * per_rep
    }

    fn region(&self, region: u32, per_rep: u32) -> Res<Vec<f64>> {
        self.read_timestamps(region * self.reps as u32, per_rep * self.reps as u32)
    }

    /// Records one gradclip clip with its timestamps from `first`, if the
    /// device has timestamp queries (between its passes, or with `whole`
    /// only around the plain `clip_norm`, which needs timestamps between
    /// commands), submits it and waits; returns (record, record + submit +
    /// wait) host seconds.
    fn gradclip_step(
        &self,
        set: &gradclip::GradSet,
        clip: &gradclip::ClipNorm,
        first: u32,
        whole: bool,
    ) -> Res<(f64, f64)> {
        let queries = self.queries.as_ref().filter(|_| self.timestamps);
        let mut enc = self.encoder("bench gradclip step");
        let t0 = Instant::now();
        match queries {
            Some(q) if whole => {
                enc.write_timestamp(q, first);
                set.clip_norm(&mut enc, clip)?;
                enc.write_timestamp(q, first + 1);
            }
            Some(q) => set.clip_norm_timed(&mut enc, clip, q, first)?,
            None => set.clip_norm(&mut enc, clip)?,
        }
        let record = t0.elapsed();
        self.queue.submit([enc.finish()]);
        self.wait()?;
        Ok((record.as_secs_f64(), t0.elapsed().as_secs_f64()))
    }

    /// Repetition `r` of a gradclip clip: restores the gradients, runs
    /// [`gradclip_step`](Self::gradclip_step) with the timestamps of
    /// `region`, keeps its host times in `s` after the warm-up, and after
    /// the last repetition returns its report (read outside the timing).
    fn gradclip_rep(
        &self,
        c: &CaseInputs,
        clip: &gradclip::ClipNorm,
        region: u32,
        whole: bool,
        r: usize,
        s: &mut Samples,
    ) -> Res<Option<gradclip::ClipReport>> {
        self.restore(c.buffers)?;
        let per_rep = if whole { WHOLE_STAMPS } else { GRADCLIP_STAMPS };
        let (record, wall) =
            self.gradclip_step(c.set, clip, self.slot(region, per_rep, r), whole)?;
        if r >= self.warmup {
            s.record.push(record);
            s.wall.push(wall);
        }
        if r + 1 < self.warmup + self.reps {
            return Ok(None);
        }
        Ok(Some(pollster::block_on(c.set.read_report())?))
    }

    /// Records one roofline pass (with begin and end timestamps at `first`
    /// where there are timestamp queries), submits it and waits; returns the
    /// wall seconds.
    fn roofline_pass(&self, r: &RooflineCase, kind: Kind, first: u32) -> Res<f64> {
        let shape = match kind {
            Kind::Read => &r.read,
            Kind::Multiply => &r.multiply,
            Kind::Power => &r.power.as_ref().ok_or("no power roofline in this case")?.0,
            Kind::Records => {
                &r.records
                    .as_ref()
                    .ok_or("no records roofline in this case")?
                    .0
            }
        };
        let mut enc = self.encoder("bench roofline");
        let t0 = Instant::now();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("bench roofline"),
                timestamp_writes: self.queries.as_ref().filter(|_| self.timestamps).map(|q| {
                    wgpu::ComputePassTimestampWrites {
                        query_set: q,
                        beginning_of_pass_write_index: Some(first),
                        end_of_pass_write_index: Some(first + 1),
                    }
                }),
            });
            r.rooflines.record(r.set, &mut pass, kind, shape, true)?;
        }
        self.queue.submit([enc.finish()]);
        self.wait()?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Measures one case: per repetition, the device copy, gradclip (and
    /// gradclip with tensor norms), the rooflines, the per-tensor baseline
    /// and the CPU loop, one after the other.
    pub fn run_case(&self, mut c: CaseInputs) -> Res<CaseSamples> {
        let b = c.buffers;
        let clip = gradclip::ClipNorm::new(c.max_norm).norm(match c.norm {
            NormKind::L2 => gradclip::Norm::L2,
            NormKind::Inf => gradclip::Norm::Inf,
            NormKind::P3 | NormKind::P1_5 | NormKind::P4_5 => {
                gradclip::Norm::P(c.norm.p().unwrap() as f32)
            }
        });
        let clip_tn = clip.tensor_norms(true);
        let clip_l2 = c
            .l2_beside
            .map(|m| gradclip::ClipNorm::new(m).norm(gradclip::Norm::L2));
        if let Some((naive, set)) = c.naive {
            naive.set_max_norm(set, c.max_norm);
        }
        if let Some(r) = &c.roofline {
            r.rooflines.prepare(Kind::Read, &[r.read], true)?;
            r.rooflines.prepare(Kind::Multiply, &[r.multiply], true)?;
            r.rooflines.set_factor(r.set, 1.0);
            if let Some((shape, p)) = r.power {
                r.rooflines.prepare(Kind::Power, &[shape], true)?;
                r.rooflines.set_power(r.set, p);
            }
            if let Some((shape, count)) = r.records {
                r.rooflines.prepare(Kind::Records, &[shape], true)?;
                r.rooflines.set_records(r.set, count)?;
            }
        }
        let queries = self.queries.as_ref().filter(|_| self.timestamps);
        let mut g = Samples::new(self.reps);
        let mut tn = c.tensor_norms.then(|| Samples::new(self.reps));
        if c.whole_step && !(queries.is_some() && self.gpu_basis) {
            return Err(
                "--whole-step needs timestamps between commands (TIMESTAMP_QUERY_INSIDE_ENCODERS)"
                    .into(),
            );
        }
        let mut wh = c.whole_step.then(|| Samples::new(self.reps));
        let mut nv = c.naive.map(|_| Samples::new(self.reps));
        let mut cp = c.cpu.as_ref().map(|_| Samples::new(self.reps));
        let mut copy = Vec::with_capacity(self.reps);
        let mut host_copy = Vec::with_capacity(self.reps);
        let (mut read_wall, mut mul_wall) = (Vec::new(), Vec::new());
        let mut power_wall = Vec::new();
        let mut records_wall = Vec::with_capacity(self.reps);
        let mut cpu_out = (0.0, 0.0);
        let (mut report, mut report_tn, mut report_wh) = (None, None, None);
        let mut l2 = clip_l2.as_ref().map(|_| Samples::new(self.reps));
        let mut report_l2 = None;

        for r in 0..self.warmup + self.reps {
            let keep = r >= self.warmup;

            // The device copy: the limit, measured next to the clips.
            let mut enc = self.encoder("bench copy");
            let t0 = Instant::now();
            let copy_queries = queries.filter(|_| self.gpu_basis);
            if let Some(q) = copy_queries {
                enc.write_timestamp(q, self.slot(COPY_REGION, COPY_STAMPS, r));
            }
            enc.copy_buffer_to_buffer(&b.grads, 0, &b.copy_dst, 0, b.n * 4);
            if let Some(q) = copy_queries {
                enc.write_timestamp(q, self.slot(COPY_REGION, COPY_STAMPS, r) + 1);
            }
            self.queue.submit([enc.finish()]);
            self.wait()?;
            if keep {
                copy.push(t0.elapsed().as_secs_f64());
            }

            // gradclip; the reports are read after the last repetition's
            // step, outside its timing, so that the checks see timed work.
            if let Some(rep) = self.gradclip_rep(&c, &clip, GRADCLIP_REGION, false, r, &mut g)? {
                report = Some(rep);
            }
            if let Some(s) = tn.as_mut() {
                if let Some(rep) =
                    self.gradclip_rep(&c, &clip_tn, TENSOR_NORMS_REGION, false, r, s)?
                {
                    report_tn = Some(rep);
                }
            }
            if let Some(s) = wh.as_mut() {
                if let Some(rep) = self.gradclip_rep(&c, &clip, WHOLE_REGION, true, r, s)? {
                    report_wh = Some(rep);
                }
            }
            if let (Some(clip_l2), Some(s)) = (&clip_l2, l2.as_mut()) {
                if let Some(rep) = self.gradclip_rep(&c, clip_l2, L2_REGION, false, r, s)? {
                    report_l2 = Some(rep);
                }
            }

            // The rooflines, from the same restored state as the clips.
            if let Some(rf) = &c.roofline {
                self.restore(b)?;
                let first = self.slot(ROOFLINE_REGION, ROOFLINE_STAMPS, r);
                let read = self.roofline_pass(rf, Kind::Read, first)?;
                let mul = self.roofline_pass(rf, Kind::Multiply, first + 2)?;
                // The kernels a case has only sometimes, each in its own region.
                let optional = |present: bool, kind, region, stamps| {
                    present
                        .then(|| self.roofline_pass(rf, kind, self.slot(region, stamps, r)))
                        .transpose()
                };
                let power = optional(rf.power.is_some(), Kind::Power, POWER_REGION, POWER_STAMPS)?;
                let records = optional(
                    rf.records.is_some(),
                    Kind::Records,
                    RECORDS_REGION,
                    RECORDS_STAMPS,
                )?;
                if keep {
                    read_wall.push(read);
                    mul_wall.push(mul);
                    power_wall.extend(power);
                    records_wall.extend(records);
                }
            }

            // The per-tensor baseline.
            if let (Some((naive, set)), Some(s)) = (c.naive, nv.as_mut()) {
                self.restore(b)?;
                let mut enc = self.encoder("bench naive step");
                let stamps = queries.map(|q| (q, self.slot(NAIVE_REGION, NAIVE_STAMPS, r)));
                let t0 = Instant::now();
                naive.record(set, &mut enc, c.norm, stamps);
                let record = t0.elapsed();
                self.queue.submit([enc.finish()]);
                self.wait()?;
                if keep {
                    s.record.push(record.as_secs_f64());
                    s.wall.push(t0.elapsed().as_secs_f64());
                }
            }

            // The CPU loop, after its restore (a host copy, timed as its limit).
            if let (Some(cpu_case), Some(s)) = (c.cpu.as_mut(), cp.as_mut()) {
                let t0 = Instant::now();
                cpu_case
                    .work
                    .copy_from_slice(std::hint::black_box(cpu_case.host));
                let restored = t0.elapsed();
                let t0 = Instant::now();
                cpu_out = std::hint::black_box(cpu::clip(
                    std::hint::black_box(&mut *cpu_case.work),
                    cpu_case.ranges,
                    c.norm,
                    c.max_norm,
                ));
                let wall = t0.elapsed();
                if keep {
                    host_copy.push(restored.as_secs_f64());
                    s.wall.push(wall.as_secs_f64());
                }
            }
        }

        if self.gpu_basis {
            copy = spans(&self.region(COPY_REGION, COPY_STAMPS)?, 2, 0);
        }
        let (mut read_roofline, mut multiply_roofline) = (read_wall, mul_wall);
        let mut power_roofline = power_wall;
        let mut records_roofline = records_wall;
        if self.gpu_basis && c.roofline.is_some() {
            let stamps = self.region(ROOFLINE_REGION, ROOFLINE_STAMPS)?;
            read_roofline = spans(&stamps, 4, 0);
            multiply_roofline = spans(&stamps, 4, 2);
            if c.roofline.as_ref().is_some_and(|r| r.power.is_some()) {
                power_roofline = spans(&self.region(POWER_REGION, POWER_STAMPS)?, 2, 0);
            }
            if c.roofline.as_ref().is_some_and(|r| r.records.is_some()) {
                records_roofline = spans(&self.region(RECORDS_REGION, RECORDS_STAMPS)?, 2, 0);
            }
        }
        if queries.is_some() {
            self.gradclip_passes(&mut g, GRADCLIP_REGION)?;
            if let Some(s) = tn.as_mut() {
                self.gradclip_passes(s, TENSOR_NORMS_REGION)?;
            }
            if let Some(s) = wh.as_mut() {
                s.add_stamps(&self.region(WHOLE_REGION, WHOLE_STAMPS)?, 2, &[None]);
            }
            if let Some(s) = l2.as_mut() {
                self.gradclip_passes(s, L2_REGION)?;
            }
            if let Some(s) = nv.as_mut() {
                // Begin and end of the norms, total and scale passes.
                let stamps = self.region(NAIVE_REGION, NAIVE_STAMPS)?;
                s.add_stamps(
                    &stamps,
                    6,
                    &[Some("norms"), None, Some("total"), None, Some("scale")],
                );
            }
        }

        let report = report.ok_or("no repetition ran")?;
        let naive = match (c.naive, nv) {
            (Some((naive, set)), Some(s)) => Some((s, naive.read_result(set)?)),
            _ => None,
        };
        Ok(CaseSamples {
            gradclip: (g, (report.total_norm, report.coefficient)),
            tensor_norms: match (tn, report_tn) {
                (Some(s), Some(rep)) => {
                    Some((s, (rep.total_norm, rep.coefficient), rep.tensor_norms))
                }
                _ => None,
            },
            whole_step: match (wh, report_wh) {
                (Some(s), Some(rep)) => Some((s, (rep.total_norm, rep.coefficient))),
                _ => None,
            },
            l2_beside: match (l2, report_l2) {
                (Some(s), Some(rep)) => Some((s, (rep.total_norm, rep.coefficient))),
                _ => None,
            },
            read_roofline,
            multiply_roofline,
            power_roofline,
            records_roofline,
            naive,
            cpu: cp.map(|s| (s, cpu_out)),
            copy,
            host_copy,
        })
    }

    /// Splits gradclip's timestamps of one region into passes.
    fn gradclip_passes(&self, g: &mut Samples, region: u32) -> Res<()> {
        // 0 reduce begins, 1 finalize begins, 2 finalize ends, 3 scale begins, 4 scale ends.
        let stamps = self.region(region, GRADCLIP_STAMPS)?;
        if self.inside_passes {
            g.add_stamps(
                &stamps,
                5,
                &[Some("reduce"), Some("finalize"), Some("gap"), Some("scale")],
            );
        } else {
            let merged: Vec<f64> = stamps
                .chunks_exact(5)
                .flat_map(|s| [s[0], s[2], s[3], s[4]])
                .collect();
            g.add_stamps(
                &merged,
                4,
                &[Some("reduce+finalize"), Some("gap"), Some("scale")],
            );
        }
        Ok(())
    }

    /// Times single-pass jobs round-robin: each repetition runs every job
    /// once, each in its own compute pass and submission, so that load
    /// drifts hit all of them alike. Returns each job's samples on the
    /// run's basis (pass timestamps, or wall time around submit + wait).
    pub fn time_jobs(&self, jobs: &[Job], reps: usize, warmup: usize) -> Res<Vec<Vec<f64>>> {
        let mut out = vec![Vec::with_capacity(reps); jobs.len()];
        for batch in (0..jobs.len()).collect::<Vec<_>>().chunks(MAX_JOBS_PER_SET) {
            let timer = self
                .gpu_basis
                .then(|| JobTimer::new(&self.device, batch.len()));
            for r in 0..warmup + reps {
                let mut wall = Vec::with_capacity(batch.len());
                for (k, &j) in batch.iter().enumerate() {
                    let mut enc = self.encoder("bench job");
                    let t0 = Instant::now();
                    {
                        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("bench job"),
                            timestamp_writes: timer.as_ref().map(|t| {
                                wgpu::ComputePassTimestampWrites {
                                    query_set: &t.queries,
                                    beginning_of_pass_write_index: Some(2 * k as u32),
                                    end_of_pass_write_index: Some(2 * k as u32 + 1),
                                }
                            }),
                        });
                        (jobs[j])(&mut pass)?;
                    }
                    self.queue.submit([enc.finish()]);
                    self.wait()?;
                    wall.push(t0.elapsed().as_secs_f64());
                }
                if r < warmup {
                    continue;
                }
                match &timer {
                    Some(t) => {
                        let stamps = t.read(self)?;
                        for (k, &j) in batch.iter().enumerate() {
                            out[j].push((stamps[2 * k + 1] - stamps[2 * k]) * 1e-9);
                        }
                    }
                    None => {
                        for (k, &j) in batch.iter().enumerate() {
                            out[j].push(wall[k]);
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// One timed job of [`Bench::time_jobs`]: records its dispatches into a pass.
pub type Job<'a> = Box<dyn Fn(&mut wgpu::ComputePass) -> Res<()> + 'a>;

/// Jobs one query set can time (two queries each).
const MAX_JOBS_PER_SET: usize = (crate::MAX_QUERIES / 2) as usize;

/// The query set of one batch of jobs.
struct JobTimer {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    count: u32,
}

impl JobTimer {
    fn new(device: &wgpu::Device, jobs: usize) -> Self {
        let count = 2 * jobs as u32;
        let bytes = count as u64 * 8;
        Self {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench job timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench job timestamp resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench job timestamp readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            count,
        }
    }

    /// The batch's timestamps in nanoseconds.
    fn read(&self, bench: &Bench) -> Res<Vec<f64>> {
        let mut enc = bench.encoder("bench job resolve");
        enc.resolve_query_set(&self.queries, 0..self.count, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, self.count as u64 * 8);
        bench.queue.submit([enc.finish()]);
        let bytes = crate::read_mapped(&bench.device, &self.readback)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as f64 * bench.period_ns)
            .collect())
    }
}
