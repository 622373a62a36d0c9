//! Copies of a set's stats back to the host, made only when a read asks.
//!
//! A read records a copy of the stats it needs (the report log, the whole
//! stats with the per-tensor norms, or one log entry) into an encoder of its
//! own, submits it, and maps the destination when that submission is done.
//! Readback buffers are pooled per kind and made the first time a kind is
//! needed, so a set that never asks for per-tensor norms never allocates
//! their readback. A buffer is owned by one read from the copy to the unmap.

use std::sync::{Arc, Mutex};

use futures_intrusive::channel::shared::{oneshot_channel, OneshotReceiver};

use crate::error::{Error, Result};
use crate::lock::lock;
use crate::plan::stats_size;
use std::collections::{BTreeMap, BTreeSet};

use crate::records::{LogEntry, TensorStat, STATS_HEAD_SIZE, STATS_LOG_OFFSET};

/// What a read copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Copy {
    /// The stats up to the per-tensor array: state, partial, log.
    Head,
    /// All of the stats, per-tensor norms included.
    Full,
    /// Log entry `index`.
    Entry(u64),
}

impl Copy {
    fn kind(self) -> usize {
        match self {
            Copy::Head => 0,
            Copy::Full => 1,
            Copy::Entry(_) => 2,
        }
    }

    /// (offset in the stats buffer, bytes).
    fn range(self, tensor_count: usize) -> (u64, u64) {
        match self {
            Copy::Head => (0, STATS_HEAD_SIZE),
            Copy::Full => (0, stats_size(tensor_count)),
            Copy::Entry(index) => (
                STATS_LOG_OFFSET + index * size_of::<LogEntry>() as u64,
                size_of::<LogEntry>() as u64,
            ),
        }
    }
}

/// Where a readback buffer stands. One mutex decides between the map
/// callback and a ticket dropped unread, so a buffer is never left mapped.
#[derive(Debug)]
enum State {
    Free,
    /// Copy submitted, map callback not run yet.
    InFlight,
    Mapped,
    Failed(String),
    /// The ticket was dropped before the callback ran: the callback frees it.
    Abandoned,
}

#[derive(Debug)]
struct Slot {
    buffer: wgpu::Buffer,
    kind: usize,
    state: Mutex<State>,
}

/// A copy on its way back. Dropped unread, its buffer returns to the pool
/// (unmapped) as soon as the copy is back.
#[derive(Debug)]
pub(crate) struct Ticket {
    slot: Arc<Slot>,
    size: u64,
    #[cfg(not(target_arch = "wasm32"))]
    submission: wgpu::SubmissionIndex,
    /// Resolves when the map callback has run: the browser awaits it, and
    /// natively a wait whose callback another thread's poll is running.
    signal: OneshotReceiver<()>,
}

impl Ticket {
    /// Whether the copy is back (mapped or failed), without waiting.
    pub fn is_done(&self) -> bool {
        !matches!(*lock(&self.slot.state), State::InFlight)
    }

    /// Waits for the copy. Natively this blocks the calling thread until the
    /// GPU has done this read's submission (and so everything submitted
    /// before it), not later work; in the browser it awaits the map.
    pub async fn wait(&self, device: &wgpu::Device) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = device;
            if !self.is_done() {
                device
                    .poll(wgpu::PollType::Wait {
                        submission_index: Some(self.submission.clone()),
                        timeout: None,
                    })
                    .map_err(|e| Error::Readback(e.to_string()))?;
            }
            if !self.is_done() {
                // Another thread's poll took the callback and is running it
                // right now: the submission is done, so this wait is short.
                self.signal.receive().await;
            }
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = device;
            if !self.is_done() {
                self.signal.receive().await;
            }
        }
        Ok(())
    }

    /// The copied bytes, once the copy is back.
    pub fn read<T>(&self, parse: impl FnOnce(&[u8]) -> T) -> Result<T> {
        match &*lock(&self.slot.state) {
            State::Mapped => {
                let view = self
                    .slot
                    .buffer
                    .get_mapped_range(..self.size)
                    .map_err(|e| Error::Readback(e.to_string()))?;
                Ok(parse(&view))
            }
            State::Failed(message) => Err(Error::Readback(message.clone())),
            _ => Err(Error::Readback("the copy is not back yet".into())),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = lock(&self.slot.state);
        *state = match *state {
            State::InFlight => State::Abandoned,
            State::Mapped => {
                self.slot.buffer.unmap();
                State::Free
            }
            _ => State::Free,
        };
    }
}

/// A set's readback buffers.
#[derive(Debug)]
pub(crate) struct Readbacks {
    tensor_count: usize,
    slots: Mutex<Vec<Arc<Slot>>>,
}

impl Readbacks {
    pub fn new(tensor_count: usize) -> Self {
        Self {
            tensor_count,
            slots: Mutex::new(Vec::new()),
        }
    }

    /// Records and submits a copy of `what` from `stats`; the returned ticket
    /// says when it is back. The submission happens now, on `queue`, after
    /// everything submitted before this call.
    pub fn issue(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        stats: &wgpu::Buffer,
        what: Copy,
    ) -> Result<Ticket> {
        let (offset, size) = what.range(self.tensor_count);
        let slot = self.take(device, what.kind(), size);
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("gradclip report readback"),
        });
        encoder.copy_buffer_to_buffer(stats, offset, &slot.buffer, 0, size);
        let (sender, signal) = oneshot_channel();
        let owner = slot.clone();
        encoder.map_buffer_on_submit(&slot.buffer, wgpu::MapMode::Read, ..size, move |result| {
            let mut state = lock(&owner.state);
            *state = match (&*state, result) {
                (State::Abandoned, Ok(())) => {
                    owner.buffer.unmap();
                    State::Free
                }
                (State::Abandoned, Err(_)) => State::Free,
                (_, Ok(())) => State::Mapped,
                (_, Err(e)) => State::Failed(e.to_string()),
            };
            drop(state);
            let _ = sender.send(());
        });
        let submission = queue.submit([encoder.finish()]);
        #[cfg(target_arch = "wasm32")]
        let _ = submission;
        Ok(Ticket {
            slot,
            size,
            #[cfg(not(target_arch = "wasm32"))]
            submission,
            signal,
        })
    }

    /// A free readback buffer of `kind` (at least `size` bytes), marked in flight.
    fn take(&self, device: &wgpu::Device, kind: usize, size: u64) -> Arc<Slot> {
        let mut slots = lock(&self.slots);
        for slot in slots.iter() {
            let mut state = lock(&slot.state);
            if slot.kind == kind && matches!(*state, State::Free) && slot.buffer.size() >= size {
                *state = State::InFlight;
                return slot.clone();
            }
        }
        // On wasm32 wgpu's handles are neither Send nor Sync; the Arc is for
        // sharing with map callbacks, which run on the same thread there.
        #[allow(clippy::arc_with_non_send_sync)]
        let slot = Arc::new(Slot {
            buffer: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("gradclip readback {}", slots.len())),
                size: size.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            kind,
            state: Mutex::new(State::InFlight),
        });
        slots.push(slot.clone());
        slot
    }

    /// Readback buffers made so far, of each kind (head, full, entry), and
    /// their bytes.
    pub fn made(&self) -> ([usize; 3], u64) {
        let mut counts = [0; 3];
        let mut bytes = 0;
        for slot in lock(&self.slots).iter() {
            counts[slot.kind] += 1;
            bytes += slot.buffer.size();
        }
        (counts, bytes)
    }
}

/// The reading side of a set: its readback buffers and the reads that
/// `poll_reports` started and has not collected yet.
#[derive(Debug)]
pub(crate) struct Reader {
    pub readbacks: Readbacks,
    /// Background reads that `poll_reports` started, with what they copy.
    pub pending: Mutex<Vec<(Ticket, Copy)>>,
    /// What has been read so far (the report module keeps it).
    pub book: Mutex<Book>,
}

impl Reader {
    pub fn new(tensor_count: usize) -> Self {
        Self {
            readbacks: Readbacks::new(tensor_count),
            pending: Mutex::new(Vec::new()),
            book: Mutex::new(Book::default()),
        }
    }
}

/// One step's log entry as read back, with its per-tensor stats when the
/// read caught them.
#[derive(Clone, Debug)]
pub(crate) struct Read {
    pub step: u64,
    pub entry: LogEntry,
    pub tensors: Option<Arc<Vec<TensorStat>>>,
}

/// What the reads of a set have found: reports not yet taken, and which
/// steps are settled (delivered, or known lost).
#[derive(Debug)]
pub(crate) struct Book {
    /// Every step below this is settled.
    pub settled_below: u64,
    /// Settled steps at or above `settled_below`.
    pub settled: BTreeSet<u64>,
    /// Delivered and not yet taken, by step.
    pub queue: BTreeMap<u64, Read>,
    /// The newest step read back so far.
    pub latest: Option<Read>,
    /// Steps lost since the last take.
    pub dropped: u64,
    /// The latest step asking for per-tensor norms when a copy last included them.
    pub tensors_copied_for: u64,
    /// Steps recorded when `poll_reports` last started a read.
    pub started_for: u64,
}

impl Default for Book {
    fn default() -> Self {
        Self {
            // Steps count from 1: there is no step 0 to wait for.
            settled_below: 1,
            settled: BTreeSet::new(),
            queue: BTreeMap::new(),
            latest: None,
            dropped: 0,
            tensors_copied_for: 0,
            started_for: 0,
        }
    }
}
