//! Clip reports: what each step found and did, read back only when asked.
//!
//! Finalize writes every norm clip's report into a log of the last
//! [`LOG_LEN`](crate::records::LOG_LEN) steps on the GPU, at the index of the
//! step number the host gave the clip when it was recorded. Steps copy
//! nothing back; a read copies the log (with the per-tensor norms when a
//! step asked for them) in a submission of its own and keeps what it finds
//! by step number. So reports never stall a step, a step that never ran
//! (encoder dropped, submission rejected) never makes a report, and a step
//! whose log entry was overwritten before any read is counted as dropped.
//! Threads may submit steps out of the order they recorded them in: a step
//! that runs after a newer step of its log slot leaves that entry alone
//! (finalize's `write_log`) and is the one counted as dropped.

use std::future::Future;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::grad_set::GradSet;
use crate::lock::lock;
use crate::partial::NormPartial;
use crate::readback::{Book, Copy, Read, Ticket};
use crate::records::{
    LogEntry, TensorStat, CFG_ERROR_IF_NONFINITE, CFG_PER_TENSOR, CFG_TENSOR_NORMS, FLAG_INF,
    FLAG_INVALID, FLAG_NAN, LOG_LEN, STATS_LOG_OFFSET, STATS_TENSORS_OFFSET,
    STATS_TENSORS_STEP_OFFSET,
};

/// What a clip found and did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClipReport {
    /// The global norm of all gradients before clipping; `+inf` if it is
    /// larger than `f32::MAX` (the factor is still exact then) or an
    /// element was infinite, NaN if an element was NaN.
    pub total_norm: f32,
    /// The factor the gradients were multiplied by (1.0: untouched),
    /// rounded once to an f32 from its exact form (it may be subnormal or 0
    /// where the exact factor is below the normal range; the gradients got
    /// the exact one). When clipping per tensor, the factor the global norm
    /// would give; the factors applied are in `tensor_coefficients`.
    pub coefficient: f32,
    /// Whether any gradient element was NaN or infinite.
    pub nonfinite: bool,
    /// For a clip made with [`ClipNorm::unscale`](crate::ClipNorm::unscale):
    /// an element was NaN or infinite, the gradients were left as they were
    /// and the optimizer step should be skipped (GradScaler's `found_inf`).
    /// Always false for other clips.
    pub found_inf: bool,
    /// The supplied partial of a `clip_with_partial_from` held bits no
    /// reduction can produce: nothing was changed (read_report returns
    /// [`Error::InvalidPartial`] for it).
    pub invalid_partial: bool,
    /// The `max_norm` (TensorFlow: `clip_norm`) the clip used; for an
    /// adaptive clip ([`crate::AdaptiveClip`]) the threshold its GPU pass
    /// chose (`f32::MAX`: no clipping that step); [`clipped`](Self::clipped)
    /// says whether the norm was above it.
    pub max_norm: f32,
    /// The loss scale this clip divided the gradients by (1 if it did not unscale).
    pub unscaled_by: f32,
    /// The loss scale after this clip's GradScaler update: the one for the
    /// next backward pass.
    pub loss_scale: f32,
    /// GradScaler's growth tracker after the update: finite steps in a row
    /// since the scale last changed.
    pub growth_tracker: u32,
    /// Which norm clip on the set this is, counting from 1 in the order the
    /// clips were recorded.
    pub step: u64,
    /// This set's share of the norm, to combine with other shards'.
    pub partial: NormPartial,
    /// Each tensor's norm, in layout order, when the clip asked for them
    /// (`ClipNorm::tensor_norms` or `per_tensor`) and a read copied them
    /// before a later such clip replaced them; empty otherwise.
    pub tensor_norms: Vec<f32>,
    /// Each tensor's factor, alongside `tensor_norms`.
    pub tensor_coefficients: Vec<f32>,
}

impl ClipReport {
    /// Whether the norm was above the threshold: a finite `total_norm`
    /// greater than `max_norm`. For ZClip and AutoClip this is their
    /// decision (`AdaptiveDecision::clipped`), from the same two f32s; for
    /// a fixed clip, TensorFlow's rule for scaling. (PyTorch's factor
    /// `max_norm / (norm + 1e-6)` is also a hair below 1 for a norm just
    /// under `max_norm`; `coefficient` is what was applied.) A non-finite
    /// norm is not "clipped": see `nonfinite` and `found_inf`.
    ///
    /// ```
    /// let mut report = gradclip::ClipReport::default();
    /// (report.total_norm, report.max_norm) = (5.0, 1.0);
    /// assert!(report.clipped());
    /// report.total_norm = f32::NAN;
    /// assert!(!report.clipped());
    /// ```
    pub fn clipped(&self) -> bool {
        self.total_norm.is_finite() && self.total_norm > self.max_norm
    }

    /// `(name, norm)` of each tensor, for a layout made with names.
    pub fn named_norms<'a>(
        &'a self,
        layout: &'a crate::GradLayout,
    ) -> impl Iterator<Item = (&'a str, f32)> + 'a {
        self.tensor_norms
            .iter()
            .enumerate()
            .map(|(i, &n)| (layout.name(i).unwrap_or(""), n))
    }
}

/// The reports a read collected: every report since the previous
/// collection, oldest first, and how many could not be kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reports {
    pub reports: Vec<ClipReport>,
    /// Steps since the previous collection whose reports are lost: their
    /// log entries were overwritten by [`LOG_LEN`](crate::records::LOG_LEN)
    /// later steps before any read, or they never ran (an encoder dropped
    /// unsubmitted, a submission rejected). Also logged as a warning.
    pub dropped: u64,
    /// Of `reports`, those that asked for per-tensor norms but come without
    /// them: a later clip replaced the norms before a read copied them.
    pub tensor_norms_missed: u64,
}

/// Undelivered reads kept at most; past it the oldest are dropped (and counted).
const QUEUE_CAP: usize = 4 * LOG_LEN as usize;

/// The factor `m * 2^e`, rounded once to an f32.
fn factor(m: f32, e: i32) -> f32 {
    if m == 0.0 || !m.is_finite() {
        return m;
    }
    (m as f64 * (e as f64).exp2()) as f32
}

/// The step whose low 32 bits are `low`, among steps `1..=recorded`; 0 for none.
fn full_step(low: u32, recorded: u64) -> u64 {
    let candidate = (recorded & !0xffff_ffff) | low as u64;
    let step = if candidate > recorded {
        candidate.wrapping_sub(1 << 32)
    } else {
        candidate
    };
    if step > recorded {
        0
    } else {
        step
    }
}

fn to_report(read: &Read) -> ClipReport {
    let state = &read.entry.state;
    let (tensor_norms, tensor_coefficients) = match &read.tensors {
        Some(stats) => stats
            .iter()
            .map(|t| (t.norm, factor(t.coef_mant, t.coef_exp)))
            .unzip(),
        None => (Vec::new(), Vec::new()),
    };
    ClipReport {
        total_norm: state.total_norm,
        coefficient: factor(state.coef_mant, state.coef_exp),
        nonfinite: state.nonfinite & (FLAG_INF | FLAG_NAN) != 0,
        found_inf: state.found_inf != 0,
        invalid_partial: state.nonfinite & FLAG_INVALID != 0,
        max_norm: state.max_norm,
        unscaled_by: state.unscaled_by,
        loss_scale: state.loss_scale,
        growth_tracker: state.growth_tracker,
        step: read.step,
        partial: NormPartial(read.entry.partial),
        tensor_norms,
        tensor_coefficients,
    }
}

/// The report of `read`, or the error its clip asked for.
fn to_result(read: &Read) -> Result<ClipReport> {
    let report = to_report(read);
    if report.invalid_partial {
        return Err(Error::InvalidPartial(
            "the supplied partial held bits no reduction produces",
        ));
    }
    if report.nonfinite && read.entry.state.flags & CFG_ERROR_IF_NONFINITE != 0 {
        return Err(Error::NonFinite {
            total_norm: report.total_norm,
        });
    }
    Ok(report)
}

fn asked_for_tensors(read: &Read) -> bool {
    read.entry.state.flags & (CFG_TENSOR_NORMS | CFG_PER_TENSOR) != 0
}

impl Book {
    /// Takes in a copy of the stats (`full`: with the per-tensor array) made
    /// when `recorded` steps had been recorded or more.
    fn absorb(&mut self, bytes: &[u8], full: bool, recorded: u64, tensor_count: usize) {
        let tensors = full.then(|| {
            let low: u32 =
                bytemuck::pod_read_unaligned(&bytes[STATS_TENSORS_STEP_OFFSET as usize..][..4]);
            let at = STATS_TENSORS_OFFSET as usize;
            let stats: Vec<TensorStat> = (0..tensor_count)
                .map(|i| bytemuck::pod_read_unaligned(&bytes[at + 16 * i..][..16]))
                .collect();
            (full_step(low, recorded), Arc::new(stats))
        });
        let mut newest = 0;
        for index in 0..LOG_LEN as usize {
            let at = STATS_LOG_OFFSET as usize + index * size_of::<LogEntry>();
            let entry: LogEntry =
                bytemuck::pod_read_unaligned(&bytes[at..][..size_of::<LogEntry>()]);
            let step = full_step(entry.state.step, recorded);
            if step == 0 || step % LOG_LEN != index as u64 {
                continue; // never written, or not a step of this set
            }
            newest = newest.max(step);
            let read = Read {
                step,
                entry,
                tensors: tensors
                    .as_ref()
                    .filter(|(s, _)| *s == step)
                    .map(|(_, t)| t.clone()),
            };
            if self.latest.as_ref().is_none_or(|l| {
                l.step < step || (l.step == step && l.tensors.is_none() && read.tensors.is_some())
            }) {
                self.latest = Some(read.clone());
            }
            if step >= self.settled_below && self.settled.insert(step) {
                self.queue.insert(step, read);
            } else if let Some(queued) = self.queue.get_mut(&step) {
                if queued.tensors.is_none() {
                    queued.tensors = read.tensors;
                }
            }
        }
        // A step LOG_LEN or more below the newest one seen has had its entry
        // overwritten unless this copy still shows it: it is lost.
        if let Some(below) = newest.checked_sub(LOG_LEN - 1) {
            if below > self.settled_below {
                let kept = self.settled.range(self.settled_below..below).count() as u64;
                let lost = below - self.settled_below - kept;
                if lost > 0 {
                    log::warn!("gradclip: {lost} step reports were lost before a read");
                }
                self.dropped += lost;
                self.settled_below = below;
                self.settled = self.settled.split_off(&below);
            }
        }
        while self.settled.remove(&self.settled_below) {
            self.settled_below += 1;
        }
        while self.queue.len() > QUEUE_CAP {
            self.queue.pop_first();
            self.dropped += 1;
            log::warn!("gradclip: more than {QUEUE_CAP} reports unread; the oldest is dropped");
        }
    }

    /// Every queued report, oldest first, with the counts since the last take.
    fn take(&mut self) -> Reports {
        let queue = std::mem::take(&mut self.queue);
        let tensor_norms_missed = queue
            .values()
            .filter(|r| asked_for_tensors(r) && r.tensors.is_none())
            .count() as u64;
        Reports {
            reports: queue.values().map(to_report).collect(),
            dropped: std::mem::take(&mut self.dropped),
            tensor_norms_missed,
        }
    }
}

impl GradSet {
    /// Starts a copy of the stats: with the per-tensor array if a step asked
    /// for per-tensor norms since the last copy that included them.
    fn start_read(&self) -> Result<(Ticket, Copy)> {
        let tensor_step = self.tensor_steps();
        let what = {
            let mut book = lock(&self.reader().book);
            if tensor_step > book.tensors_copied_for {
                book.tensors_copied_for = tensor_step;
                Copy::Full
            } else {
                Copy::Head
            }
        };
        let inner = self.inner();
        let ticket = self.reader().readbacks.issue(
            &inner.device,
            &inner.queue,
            self.stats_buffer(),
            what,
        )?;
        Ok((ticket, what))
    }

    /// Takes in a copy that is back.
    fn absorb(&self, ticket: &Ticket, what: Copy) -> Result<()> {
        let recorded = self.steps_recorded();
        let tensor_count = self.layout().len();
        let mut book = lock(&self.reader().book);
        ticket.read(|bytes| book.absorb(bytes, what == Copy::Full, recorded, tensor_count))
    }

    /// Takes in the background reads of `poll_reports` that are back.
    fn absorb_pending(&self) -> Result<()> {
        let done: Vec<(Ticket, Copy)> = {
            let mut pending = lock(&self.reader().pending);
            let (done, waiting) = std::mem::take(&mut *pending)
                .into_iter()
                .partition(|(t, _)| t.is_done());
            *pending = waiting;
            done
        };
        let mut result = Ok(());
        for (ticket, what) in &done {
            if let Err(e) = self.absorb(ticket, *what) {
                result = Err(e);
            }
        }
        result
    }

    /// A fresh read that sees every step submitted before this call, waited for.
    async fn read_now(&self) -> Result<()> {
        let (ticket, what) = self.start_read()?;
        ticket.wait(&self.inner().device).await?;
        self.absorb_pending()?;
        self.absorb(&ticket, what)
    }

    /// Collects whatever reports are back, without waiting: natively it
    /// polls the device once (`PollType::Poll`, never blocking), takes in
    /// the reads that are back, and starts a read of the steps recorded
    /// since the last one it started, to be collected by a later call. A
    /// training loop that calls it after each submission gets every step's
    /// report a step or two later and never waits; `reports` is empty until
    /// the first read is back. In the browser, reads come back from the event
    /// loop, so call it again after an `await`.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[3.0f32, 4.0]),
    /// #     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
    /// let mut norms = Vec::new();
    /// for _ in 0..5 {
    ///     let mut encoder = device.create_command_encoder(&Default::default());
    ///     set.clip_norm(&mut encoder, &gradclip::ClipNorm::new(10.0))?;
    ///     queue.submit([encoder.finish()]);
    ///     norms.extend(set.poll_reports()?.reports.iter().map(|r| r.total_norm));
    /// }
    /// // The rest, waiting this time.
    /// norms.extend(set.take_reports().await?.reports.iter().map(|r| r.total_norm));
    /// assert_eq!(norms, [5.0; 5]);
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub fn poll_reports(&self) -> Result<Reports> {
        #[cfg(not(target_arch = "wasm32"))]
        self.inner()
            .device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| Error::Readback(e.to_string()))?;
        self.absorb_pending()?;
        let recorded = self.steps_recorded();
        let start = {
            let mut book = lock(&self.reader().book);
            let pending = lock(&self.reader().pending);
            // One read in flight at a time. Start one for steps recorded
            // since the last read began, and again while recorded steps are
            // still unseen: a read that began before their submission did
            // not see them.
            let unseen = book.latest.as_ref().map_or(0, |l| l.step) < recorded;
            let start = pending.is_empty() && (recorded > book.started_for || unseen);
            if start {
                book.started_for = recorded;
            }
            start
        };
        if start {
            let read = self.start_read()?;
            lock(&self.reader().pending).push(read);
        }
        Ok(lock(&self.reader().book).take())
    }

    /// The report of the latest norm clip recorded on this set that has run
    /// (submitted, and not rejected). It submits a copy of the report log
    /// (a few KiB, plus 16 bytes per tensor when a step asked for per-tensor
    /// norms) and waits for that submission only: natively it blocks the
    /// calling thread until the GPU has done the work submitted before the
    /// call — not later submissions of other threads — and in the browser it
    /// awaits the map. It never has to be called, and other steps can go on
    /// being recorded and submitted meanwhile.
    ///
    /// Errors: [`Error::NoReport`] before any norm clip was recorded,
    /// [`Error::NotSubmitted`] when none has run yet, [`Error::NonFinite`]
    /// for a clip made with `error_if_nonfinite` whose norm was NaN or
    /// infinite, [`Error::InvalidPartial`] for a `clip_with_partial_from`
    /// whose partial was garbage, [`Error::Readback`] if the copy failed
    /// (device lost). Reading a report does not take it: `take_reports`
    /// still returns it.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[f32::INFINITY, 1.0]),
    /// #     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// set.clip_norm(&mut encoder, &gradclip::ClipNorm::new(1.0).error_if_nonfinite(true))?;
    /// queue.submit([encoder.finish()]);
    /// let error = set.read_report().await.unwrap_err();
    /// assert_eq!(error, gradclip::Error::NonFinite { total_norm: f32::INFINITY });
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub async fn read_report(&self) -> Result<ClipReport> {
        if self.steps_recorded() == 0 {
            return Err(Error::NoReport);
        }
        self.read_now().await?;
        let book = lock(&self.reader().book);
        book.latest
            .as_ref()
            .map(to_result)
            .unwrap_or(Err(Error::NotSubmitted))
    }

    /// Every report since the previous `take_reports` or `poll_reports`,
    /// oldest first, waiting as [`read_report`](Self::read_report) does. The
    /// log on the GPU holds the last [`LOG_LEN`](crate::records::LOG_LEN)
    /// steps: reading at least that often (or calling `poll_reports` after
    /// each step) keeps every report; otherwise `dropped` says how many were
    /// lost. `error_if_nonfinite` shows here as `nonfinite` on the report
    /// rather than as an error.
    ///
    /// ```
    /// # pollster::block_on(async {
    /// # use wgpu::util::DeviceExt;
    /// # let (device, queue, _) = gradclip::default_device().await?;
    /// # let clipper = gradclip::Clipper::new(&device, &queue)?;
    /// # let grads = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
    /// #     label: None, contents: bytemuck::cast_slice(&[3.0f32, 4.0]),
    /// #     usage: wgpu::BufferUsages::STORAGE });
    /// let set = clipper.bind(&grads, &gradclip::GradLayout::from_sizes(&[2])?)?;
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// for max_norm in [4.0, 2.0, 1.0] {
    ///     set.clip_norm(&mut encoder, &gradclip::ClipNorm::tensorflow(max_norm))?;
    /// }
    /// queue.submit([encoder.finish()]); // three clips in one submission
    /// let taken = set.take_reports().await?;
    /// let norms: Vec<f32> = taken.reports.iter().map(|r| r.total_norm).collect();
    /// assert_eq!((norms, taken.dropped), (vec![5.0, 4.0, 2.0], 0));
    /// # Ok::<(), gradclip::Error>(()) }).unwrap();
    /// ```
    pub async fn take_reports(&self) -> Result<Reports> {
        if self.steps_recorded() > 0 {
            self.read_now().await?;
        }
        Ok(lock(&self.reader().book).take())
    }

    /// The [`NormPartial`] of the latest norm clip recorded on this set, with
    /// its step number: the 16 bytes a sharded rank exchanges. The copy of
    /// that one log entry (80 bytes) is submitted when this is called, so
    /// the caller can record and submit other work before awaiting the
    /// future; awaiting it waits as [`read_report`](Self::read_report) does.
    /// [`Error::NotSubmitted`] if that clip has not run.
    pub fn read_partial(&self) -> impl Future<Output = Result<(u64, NormPartial)>> + '_ {
        let step = self.steps_recorded();
        let started = (step > 0)
            .then(|| {
                let inner = self.inner();
                self.reader().readbacks.issue(
                    &inner.device,
                    &inner.queue,
                    self.stats_buffer(),
                    Copy::Entry(step % LOG_LEN),
                )
            })
            .transpose();
        async move {
            let Some(ticket) = started? else {
                return Err(Error::NoReport);
            };
            ticket.wait(&self.inner().device).await?;
            let entry: LogEntry = ticket.read(bytemuck::pod_read_unaligned)?;
            if full_step(entry.state.step, step) != step {
                return Err(Error::NotSubmitted);
            }
            Ok((step, NormPartial(entry.partial)))
        }
    }

    /// Readback buffers this set has made so far, for the tests' memory checks:
    /// (head copies, full copies, entry copies) and their bytes.
    #[doc(hidden)]
    pub fn readback_buffers(&self) -> ([usize; 3], u64) {
        self.reader().readbacks.made()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_come_back_from_their_low_bits() {
        assert_eq!(full_step(5, 10), 5);
        assert_eq!(full_step(11, 10), 0);
        assert_eq!(full_step(0, 10), 0);
        let recorded = (3u64 << 32) + 7;
        assert_eq!(full_step(7, recorded), recorded);
        assert_eq!(full_step(9, recorded), (2u64 << 32) + 9);
    }

    #[test]
    fn factors_round_once() {
        assert_eq!(factor(1.5, -2), 0.375);
        assert_eq!(factor(1.0, -149), f32::from_bits(1));
        assert_eq!(factor(1.0, -200), 0.0);
        assert!(factor(f32::NAN, 0).is_nan());
    }
}
