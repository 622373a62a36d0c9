//! Clip reports and the ring of readback buffers they come back through.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::records::{ClipState, FLAG_INF, FLAG_NAN};

/// What a `clip_norm` found and did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipReport {
    /// The global norm of all gradients before clipping; `+inf` if it is
    /// larger than `f32::MAX` (the coefficient is still exact then) or an
    /// element was infinite, NaN if an element was NaN.
    pub total_norm: f32,
    /// The factor the gradients were multiplied by (1.0: untouched).
    pub coefficient: f32,
    /// Whether any gradient element was NaN or infinite.
    pub nonfinite: bool,
    /// Which `clip_norm` call on the set this is, counting from 1.
    pub step: u64,
}

/// Readback buffers: one report each, so that a report can be awaited while
/// the next steps are recorded and submitted.
const SLOTS: usize = 4;
const STATE_SIZE: u64 = core::mem::size_of::<ClipState>() as u64;

#[derive(Clone, Debug)]
enum Status {
    Idle,
    /// A copy and a map were recorded; the map callback has not run yet
    /// (natively the buffer may already be mapped: another thread's poll can
    /// still be on its way to the callback).
    Pending {
        step: u64,
        error_if_nonfinite: bool,
    },
    /// Mapped: the report of `step` can be read.
    Ready {
        step: u64,
        error_if_nonfinite: bool,
    },
    Failed {
        step: u64,
        message: String,
    },
}

impl Status {
    fn step(&self) -> Option<u64> {
        match self {
            Status::Idle => None,
            Status::Pending { step, .. }
            | Status::Ready { step, .. }
            | Status::Failed { step, .. } => Some(*step),
        }
    }
}

#[derive(Debug)]
struct Shared {
    status: Mutex<Status>,
    done: futures_intrusive::sync::ManualResetEvent,
}

#[derive(Debug)]
struct Slot {
    buffer: wgpu::Buffer,
    shared: Arc<Shared>,
}

#[derive(Debug)]
pub(crate) struct ReportRing {
    slots: Vec<Slot>,
    /// The newest report read so far (`read` returns it again until a newer
    /// one arrives), with whether its clip asked for `error_if_nonfinite`.
    last_read: Mutex<Option<(ClipReport, bool)>>,
    /// Slot of the latest recorded step that got one.
    latest: Mutex<Option<usize>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these small records half-written.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ReportRing {
    pub fn new(device: &wgpu::Device) -> Self {
        let slots = (0..SLOTS)
            .map(|i| Slot {
                buffer: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("gradclip report readback {i}")),
                    size: STATE_SIZE,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                shared: Arc::new(Shared {
                    status: Mutex::new(Status::Idle),
                    done: futures_intrusive::sync::ManualResetEvent::new(false),
                }),
            })
            .collect();
        Self {
            slots,
            last_read: Mutex::new(None),
            latest: Mutex::new(None),
        }
    }

    /// Records the copy of `state` for `step` and a map that runs once the
    /// encoder is submitted and done. A slot whose map has not completed is
    /// never reused; if every slot is in flight, this step gets no report.
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        state: &wgpu::Buffer,
        step: u64,
        error_if_nonfinite: bool,
    ) {
        let preferred = (step as usize) % SLOTS;
        let free = (0..SLOTS)
            .map(|k| (preferred + k) % SLOTS)
            .find(|&i| !matches!(*lock(&self.slots[i].shared.status), Status::Pending { .. }));
        let Some(i) = free else {
            log::warn!(
                "gradclip: all {SLOTS} report buffers are in flight; step {step} has no report"
            );
            return;
        };
        let slot = &self.slots[i];
        {
            let mut status = lock(&slot.shared.status);
            if matches!(*status, Status::Ready { .. }) {
                slot.buffer.unmap();
            }
            *status = Status::Pending {
                step,
                error_if_nonfinite,
            };
            slot.shared.done.reset();
        }
        encoder.copy_buffer_to_buffer(state, 0, &slot.buffer, 0, STATE_SIZE);
        let shared = slot.shared.clone();
        encoder.map_buffer_on_submit(&slot.buffer, wgpu::MapMode::Read, .., move |result| {
            let mut status = lock(&shared.status);
            *status = match result {
                Ok(()) => Status::Ready {
                    step,
                    error_if_nonfinite,
                },
                Err(e) => Status::Failed {
                    step,
                    message: e.to_string(),
                },
            };
            shared.done.set();
        });
        *lock(&self.latest) = Some(i);
    }

    /// The report of the latest recorded step that was submitted.
    pub async fn read(&self, device: &wgpu::Device) -> Result<ClipReport> {
        let latest = (*lock(&self.latest)).ok_or(Error::NoReport)?;
        #[cfg(not(target_arch = "wasm32"))]
        {
            // Natively callbacks run inside poll: drive the device until all
            // submitted work is done. The latest slot may still be pending if
            // its encoder was not submitted; an older report is used then.
            let _ = latest;
            device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Wgpu(e.to_string()))?;
        }
        #[cfg(target_arch = "wasm32")]
        {
            // In the browser the map callback fires from the event loop once
            // the submission completes.
            let _ = device;
            let shared = self.slots[latest].shared.clone();
            shared.done.wait().await;
        }
        self.take_newest()
    }

    /// Reads the newest report that is back, if it is newer than the last one read.
    fn take_newest(&self) -> Result<ClipReport> {
        let mut last_read = lock(&self.last_read);
        let cached_step = last_read.map(|(r, _)| r.step);
        let mut by_step: Vec<(u64, usize)> = (0..SLOTS)
            .filter_map(|i| lock(&self.slots[i].shared.status).step().map(|s| (s, i)))
            .collect();
        by_step.sort_unstable_by(|a, b| b.cmp(a));
        for (step, i) in by_step {
            if Some(step) <= cached_step {
                break;
            }
            let slot = &self.slots[i];
            let mut status = lock(&slot.shared.status);
            let error_if_nonfinite = match status.clone() {
                Status::Ready {
                    error_if_nonfinite, ..
                } => error_if_nonfinite,
                // Natively a buffer mapped before its callback ran is done; an
                // unmapped one was not submitted (get_mapped_range just fails).
                // In the browser only the callback says so.
                Status::Pending {
                    error_if_nonfinite, ..
                } if cfg!(not(target_arch = "wasm32")) => error_if_nonfinite,
                Status::Failed { message, .. } => {
                    *status = Status::Idle;
                    return Err(Error::Readback(message));
                }
                _ => continue,
            };
            let Ok(view) = slot.buffer.get_mapped_range(..) else {
                continue;
            };
            let state: ClipState = bytemuck::pod_read_unaligned(&view[..STATE_SIZE as usize]);
            drop(view);
            slot.buffer.unmap();
            *status = Status::Idle;
            *last_read = Some((report_of(&state, step), error_if_nonfinite));
            break;
        }
        match *last_read {
            None => Err(Error::NotSubmitted),
            Some((report, true)) if report.nonfinite => Err(Error::NonFinite {
                total_norm: report.total_norm,
            }),
            Some((report, _)) => Ok(report),
        }
    }
}

fn report_of(state: &ClipState, step: u64) -> ClipReport {
    ClipReport {
        total_norm: state.total_norm,
        coefficient: state.coefficient,
        nonfinite: state.nonfinite & (FLAG_INF | FLAG_NAN) != 0,
        step,
    }
}
