//! Clip reports and the ring of readback buffers they come back through.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::partial::NormPartial;
use crate::records::{
    ClipState, Partial, TensorStat, FLAG_INF, FLAG_NAN, STATS_HEAD_SIZE, STATS_PARTIAL_OFFSET,
};

/// What a clip found and did.
#[derive(Clone, Debug, PartialEq)]
pub struct ClipReport {
    /// The global norm of all gradients before clipping; `+inf` if it is
    /// larger than `f32::MAX` (the coefficient is still exact then) or an
    /// element was infinite, NaN if an element was NaN.
    pub total_norm: f32,
    /// The factor the gradients were multiplied by (1.0: untouched). When
    /// clipping per tensor, the coefficient the global norm would give; the
    /// factors applied are in `tensor_coefficients`.
    pub coefficient: f32,
    /// Whether any gradient element was NaN or infinite.
    pub nonfinite: bool,
    /// For a clip made with [`ClipNorm::unscale`](crate::ClipNorm::unscale):
    /// an element was NaN or infinite, the gradients were left as they were
    /// and the optimizer step should be skipped (GradScaler's `found_inf`).
    /// Always false for other clips.
    pub found_inf: bool,
    /// The loss scale this clip divided the gradients by (1 if it did not unscale).
    pub unscaled_by: f32,
    /// The loss scale after this clip's GradScaler update: the one for the
    /// next backward pass.
    pub loss_scale: f32,
    /// GradScaler's growth tracker after the update: finite steps in a row
    /// since the scale last changed.
    pub growth_tracker: u32,
    /// Which norm clip on the set this is, counting from 1.
    pub step: u64,
    /// This set's share of the norm, to combine with other shards'.
    pub partial: NormPartial,
    /// Each tensor's norm, in layout order, when the clip asked for them
    /// (`ClipNorm::tensor_norms` or `per_tensor`); empty otherwise.
    pub tensor_norms: Vec<f32>,
    /// Each tensor's coefficient, alongside `tensor_norms`.
    pub tensor_coefficients: Vec<f32>,
}

impl ClipReport {
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

/// Readback buffers, one report each: reports of steps k, k+1, ... can be
/// awaited while later steps are recorded and submitted.
pub(crate) const SLOTS: usize = 16;

#[derive(Clone, Debug)]
struct Meta {
    step: u64,
    error_if_nonfinite: bool,
    with_tensors: bool,
}

#[derive(Clone, Debug)]
enum Status {
    Idle,
    /// A copy and a map were recorded; the map callback has not run yet
    /// (natively the buffer may already be mapped: another thread's poll can
    /// still be on its way to the callback).
    Pending(Meta),
    /// Mapped: the report can be read.
    Ready(Meta),
    Failed(String),
}

#[derive(Debug)]
struct Slot {
    buffer: wgpu::Buffer,
    /// Shared with the map callback.
    status: Arc<Mutex<Status>>,
}

#[derive(Debug, Default)]
struct Arrived {
    /// Reports read back and not yet taken, by step.
    queue: BTreeMap<u64, (ClipReport, bool)>,
    /// The newest report read back so far.
    latest: Option<(ClipReport, bool)>,
}

#[derive(Debug)]
pub(crate) struct ReportRing {
    slots: Vec<Slot>,
    tensor_count: usize,
    arrived: Mutex<Arrived>,
    /// Slot of the latest recorded step that got one.
    latest_slot: Mutex<Option<usize>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these small records half-written.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn final_result(entry: &(ClipReport, bool)) -> Result<ClipReport> {
    match entry {
        (report, true) if report.nonfinite => Err(Error::NonFinite {
            total_norm: report.total_norm,
        }),
        (report, _) => Ok(report.clone()),
    }
}

impl ReportRing {
    pub fn new(device: &wgpu::Device, tensor_count: usize) -> Self {
        let size = STATS_HEAD_SIZE + (tensor_count * size_of::<TensorStat>()) as u64;
        let slots = (0..SLOTS)
            .map(|i| Slot {
                buffer: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("gradclip report readback {i}")),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                status: Arc::new(Mutex::new(Status::Idle)),
            })
            .collect();
        Self {
            slots,
            tensor_count,
            arrived: Mutex::new(Arrived::default()),
            latest_slot: Mutex::new(None),
        }
    }

    /// Records the copy of `stats` for `step` and a map that runs once the
    /// encoder is submitted and done. A slot whose map has not completed is
    /// never reused; if every slot is in flight, this step gets no report.
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        stats: &wgpu::Buffer,
        step: u64,
        error_if_nonfinite: bool,
        with_tensors: bool,
    ) {
        let preferred = (step as usize) % SLOTS;
        let free = (0..SLOTS)
            .map(|k| (preferred + k) % SLOTS)
            .find(|&i| !matches!(*lock(&self.slots[i].status), Status::Pending(_)));
        let Some(i) = free else {
            log::warn!(
                "gradclip: all {SLOTS} report buffers are in flight; step {step} has no report"
            );
            return;
        };
        let slot = &self.slots[i];
        let meta = Meta {
            step,
            error_if_nonfinite,
            with_tensors: with_tensors && self.tensor_count > 0,
        };
        {
            let mut status = lock(&slot.status);
            if matches!(*status, Status::Ready(_)) {
                // Read back but never taken: the ring overwrites its oldest.
                slot.buffer.unmap();
            }
            *status = Status::Pending(meta.clone());
        }
        let size = if meta.with_tensors {
            slot.buffer.size()
        } else {
            STATS_HEAD_SIZE
        };
        encoder.copy_buffer_to_buffer(stats, 0, &slot.buffer, 0, size);
        let shared = slot.status.clone();
        encoder.map_buffer_on_submit(&slot.buffer, wgpu::MapMode::Read, ..size, move |result| {
            let mut status = lock(&shared);
            // A reader may have taken this report already (natively it reads
            // a mapped buffer without waiting for the callback) and the slot
            // may hold a newer step by now: then there is nothing to do.
            if matches!(&*status, Status::Pending(m) if m.step == step) {
                *status = match result {
                    Ok(()) => Status::Ready(meta),
                    Err(e) => Status::Failed(e.to_string()),
                };
            }
        });
        *lock(&self.latest_slot) = Some(i);
    }

    /// Waits for the latest recorded step's report where that is possible.
    async fn wait(&self, device: &wgpu::Device, queue: &wgpu::Queue) -> Result<()> {
        let latest = (*lock(&self.latest_slot)).ok_or(Error::NoReport)?;
        #[cfg(not(target_arch = "wasm32"))]
        {
            // Natively callbacks run inside poll: drive the device until all
            // submitted work is done. The latest slot may still be pending if
            // its encoder was not submitted; older reports are used then.
            let _ = (latest, queue);
            device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Wgpu(e.to_string()))?;
        }
        #[cfg(target_arch = "wasm32")]
        {
            // In the browser callbacks fire from the event loop. Waiting for
            // the latest slot's own map would hang if its encoder was never
            // submitted; waiting for all work submitted so far cannot, and
            // the maps of those submissions resolve first. A second round
            // lets a map callback queued in the same turn run before we look.
            let _ = (device, latest);
            for _ in 0..2 {
                let done = Arc::new(futures_intrusive::sync::ManualResetEvent::new(false));
                let signal = done.clone();
                queue.on_submitted_work_done(move || signal.set());
                done.wait().await;
            }
        }
        Ok(())
    }

    /// The report of the latest recorded step that was submitted.
    pub async fn latest(&self, device: &wgpu::Device, queue: &wgpu::Queue) -> Result<ClipReport> {
        self.wait(device, queue).await?;
        self.collect()?;
        let arrived = lock(&self.arrived);
        arrived
            .latest
            .as_ref()
            .map(final_result)
            .unwrap_or(Err(Error::NotSubmitted))
    }

    /// Every report that came back and was not taken yet, oldest first.
    pub async fn take_all(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
    ) -> Result<Vec<ClipReport>> {
        self.wait(device, queue).await?;
        self.collect()?;
        let queue = std::mem::take(&mut lock(&self.arrived).queue);
        Ok(queue.into_values().map(|(report, _)| report).collect())
    }

    /// Moves every report that is back from its slot into `arrived`.
    fn collect(&self) -> Result<()> {
        let mut failure = None;
        for slot in &self.slots {
            let mut status = lock(&slot.status);
            let meta = match &*status {
                Status::Ready(meta) => meta.clone(),
                // Natively a buffer mapped before its callback ran is done; an
                // unmapped one was not submitted (get_mapped_range just fails).
                // In the browser only the callback says so.
                Status::Pending(meta) if cfg!(not(target_arch = "wasm32")) => meta.clone(),
                Status::Failed(message) => {
                    failure = Some(message.clone());
                    *status = Status::Idle;
                    continue;
                }
                _ => continue,
            };
            let size = if meta.with_tensors {
                slot.buffer.size()
            } else {
                STATS_HEAD_SIZE
            };
            let Ok(view) = slot.buffer.get_mapped_range(..size) else {
                continue;
            };
            let report = parse(&view, &meta, self.tensor_count);
            drop(view);
            slot.buffer.unmap();
            *status = Status::Idle;
            drop(status);
            let mut arrived = lock(&self.arrived);
            let entry = (report, meta.error_if_nonfinite);
            if arrived
                .latest
                .as_ref()
                .is_none_or(|(r, _)| r.step < meta.step)
            {
                arrived.latest = Some(entry.clone());
            }
            arrived.queue.insert(meta.step, entry);
            // Reports nobody takes must not pile up.
            while arrived.queue.len() > 4 * SLOTS {
                arrived.queue.pop_first();
            }
        }
        match failure {
            Some(message) => Err(Error::Readback(message)),
            None => Ok(()),
        }
    }
}

fn parse(bytes: &[u8], meta: &Meta, tensor_count: usize) -> ClipReport {
    let state: ClipState = bytemuck::pod_read_unaligned(&bytes[..size_of::<ClipState>()]);
    let at = STATS_PARTIAL_OFFSET as usize;
    let partial: Partial = bytemuck::pod_read_unaligned(&bytes[at..at + size_of::<Partial>()]);
    let tensors: Vec<TensorStat> = if meta.with_tensors {
        let head = STATS_HEAD_SIZE as usize;
        (0..tensor_count)
            .map(|i| {
                let at = head + i * size_of::<TensorStat>();
                bytemuck::pod_read_unaligned(&bytes[at..at + size_of::<TensorStat>()])
            })
            .collect()
    } else {
        Vec::new()
    };
    ClipReport {
        total_norm: state.total_norm,
        coefficient: state.coefficient,
        nonfinite: state.nonfinite & (FLAG_INF | FLAG_NAN) != 0,
        found_inf: state.found_inf != 0,
        unscaled_by: state.unscaled_by,
        loss_scale: state.loss_scale,
        growth_tracker: state.growth_tracker,
        step: meta.step,
        partial: NormPartial(partial),
        tensor_norms: tensors.iter().map(|t| t.norm).collect(),
        tensor_coefficients: tensors.iter().map(|t| t.coefficient).collect(),
    }
}
