//! Timing: the device, its timestamp queries, and one case measured with
//! every implementation interleaved repetition by repetition, so that a
//! change in the machine's load (it is shared) hits all of them alike and
//! the ratios stay meaningful even when the absolute times drift.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::{cpu, naive, NormKind, Res};

/// Timestamp queries per repetition of each implementation, and where each
/// implementation's region of the query set starts (in units of `reps`).
const GRADCLIP_STAMPS: u32 = gradclip::GradSet::CLIP_TIMESTAMPS;
const NAIVE_STAMPS: u32 = naive::TIMESTAMPS;
const COPY_STAMPS: u32 = 2;
const GRADCLIP_REGION: u32 = 0;
const NAIVE_REGION: u32 = GRADCLIP_STAMPS;
const COPY_REGION: u32 = GRADCLIP_STAMPS + NAIVE_STAMPS;
/// Queries one repetition of a case can write.
pub const STAMPS_PER_REP: u32 = GRADCLIP_STAMPS + NAIVE_STAMPS + COPY_STAMPS;

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

/// One case: the same clip by every implementation that runs it.
pub struct CaseInputs<'a> {
    pub buffers: &'a Buffers,
    pub set: &'a gradclip::GradSet,
    pub naive: Option<(&'a naive::Naive, &'a naive::NaiveSet)>,
    pub cpu: Option<CpuCase<'a>>,
    pub norm: NormKind,
    pub max_norm: f32,
}

/// What one case measured; (norm, coefficient) of each implementation's
/// last repetition, for the checks.
pub struct CaseSamples {
    pub gradclip: (Samples, (f32, f32)),
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

    /// Measures one case: per repetition, the device copy, gradclip, the
    /// per-tensor baseline and the CPU loop, one after the other.
    pub fn run_case(&self, mut c: CaseInputs) -> Res<CaseSamples> {
        let b = c.buffers;
        let clip = gradclip::ClipNorm::new(c.max_norm).norm(match c.norm {
            NormKind::L2 => gradclip::Norm::L2,
            NormKind::Inf => gradclip::Norm::Inf,
        });
        if let Some((naive, set)) = c.naive {
            naive.set_max_norm(set, c.max_norm);
        }
        let queries = self.queries.as_ref().filter(|_| self.timestamps);
        let mut g = Samples::new(self.reps);
        let mut nv = c.naive.map(|_| Samples::new(self.reps));
        let mut cp = c.cpu.as_ref().map(|_| Samples::new(self.reps));
        let mut copy = Vec::with_capacity(self.reps);
        let mut host_copy = Vec::with_capacity(self.reps);
        let mut cpu_out = (0.0, 0.0);

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

            // gradclip.
            self.restore(b)?;
            let mut enc = self.encoder("bench gradclip step");
            let t0 = Instant::now();
            match queries {
                Some(q) => c.set.clip_norm_timed(
                    &mut enc,
                    &clip,
                    q,
                    self.slot(GRADCLIP_REGION, GRADCLIP_STAMPS, r),
                )?,
                None => c.set.clip_norm(&mut enc, &clip)?,
            }
            let record = t0.elapsed();
            self.queue.submit([enc.finish()]);
            self.wait()?;
            if keep {
                g.record.push(record.as_secs_f64());
                g.wall.push(t0.elapsed().as_secs_f64());
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
            let stamps = self.region(COPY_REGION, COPY_STAMPS)?;
            copy = stamps
                .chunks_exact(2)
                .map(|p| (p[1] - p[0]) * 1e-9)
                .collect();
        }
        if queries.is_some() {
            // 0 reduce begins, 1 finalize begins, 2 finalize ends, 3 scale begins, 4 scale ends.
            let stamps = self.region(GRADCLIP_REGION, GRADCLIP_STAMPS)?;
            if self.inside_passes {
                g.add_stamps(
                    &stamps,
                    5,
                    &[
                        Some("reduce"),
                        Some("finalize"),
                        Some("args_copy"),
                        Some("scale"),
                    ],
                );
            } else {
                let merged: Vec<f64> = stamps
                    .chunks_exact(5)
                    .flat_map(|s| [s[0], s[2], s[3], s[4]])
                    .collect();
                g.add_stamps(
                    &merged,
                    4,
                    &[Some("reduce+finalize"), Some("args_copy"), Some("scale")],
                );
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

        let report = pollster::block_on(c.set.read_report())?;
        let naive = match (c.naive, nv) {
            (Some((naive, set)), Some(s)) => Some((s, naive.read_result(set)?)),
            _ => None,
        };
        Ok(CaseSamples {
            gradclip: (g, (report.total_norm, report.coefficient)),
            naive,
            cpu: cp.map(|s| (s, cpu_out)),
            copy,
            host_copy,
        })
    }
}
