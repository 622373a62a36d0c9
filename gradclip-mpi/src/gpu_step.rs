//! The GPU side of a distributed step, and the only module that calls
//! gradclip's per-step API: record the local norm and bring back what the
//! exchange needs (the 16-byte partial, and the loss scale or the pieces'
//! norms when asked), then record the clip with the combined partial.
//!
//! Written against today's core: the partial is copied out of
//! `set.stats_buffer()` into a readback buffer of our own (so only that
//! record is mapped, not a whole report), and `clip_with_partial` reads the
//! combined partial from a small source buffer. With the core's API v2 the
//! readback becomes `set.read_partial()` and the clip takes the host value.

use std::sync::{Arc, Mutex};

use gradclip::{ClipNorm, GradSet, NormPartial};

/// Byte offsets in the stats buffer (gradclip's `records`: `ClipState` at
/// 0, its `loss_scale` at 36, the partial at `set.partial_offset()`, the
/// per-tensor records of 16 bytes from 80, each with its norm at +8).
const LOSS_SCALE_OFFSET: u64 =
    core::mem::offset_of!(gradclip::records::ClipState, loss_scale) as u64;
const TENSORS_OFFSET: u64 = gradclip::records::STATS_TENSORS_OFFSET;
const TENSOR_STAT_BYTES: u64 = size_of::<gradclip::records::TensorStat>() as u64;
const TENSOR_NORM_OFFSET: u64 = core::mem::offset_of!(gradclip::records::TensorStat, norm) as u64;
const PARTIAL_BYTES: u64 = 16;

/// What one rank's local norm brought back.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Local {
    /// The partial of the stored values (not unscaled).
    pub partial: NormPartial,
    /// The loss scale the clip will divide by, when it unscales.
    pub loss_scale: Option<f32>,
    /// Each local tensor's norm of the stored values, when asked.
    pub tensor_norms: Vec<f32>,
}

/// Which bytes of the stats buffer a step copied back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Copied {
    start: u64,
    len: u64,
    loss_scale: bool,
    tensor_norms: bool,
}

/// The readback buffer and the source buffer of one set, made once.
#[derive(Debug)]
pub(crate) struct GpuStep {
    device: wgpu::Device,
    queue: wgpu::Queue,
    readback: wgpu::Buffer,
    /// Set by the map callback: `Some(Ok)` once mapped.
    mapped: Arc<Mutex<Option<Result<(), String>>>>,
    /// The combined partial for `clip_with_partial` (today's core reads it
    /// from a buffer).
    combined: wgpu::Buffer,
}

impl GpuStep {
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue, set: &GradSet) -> Self {
        let tensors = set.layout().len() as u64;
        Self {
            device: device.clone(),
            queue: queue.clone(),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gradclip-mpi partial readback"),
                size: TENSORS_OFFSET + tensors * TENSOR_STAT_BYTES,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            mapped: Arc::new(Mutex::new(None)),
            combined: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gradclip-mpi combined partial"),
                size: PARTIAL_BYTES,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        }
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Records the norm of the stored gradients (never unscaling: the loss
    /// scale is updated once, by the clip) and the copy of what the exchange
    /// needs: the 16-byte partial alone unless the clip unscales or wants
    /// per-tensor norms.
    pub fn record_local(
        &self,
        set: &GradSet,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
    ) -> gradclip::Result<Copied> {
        let local = clip
            .unscale(false)
            .per_tensor(false)
            .tensor_norms(clip.reports_tensor_norms());
        set.record_norm(encoder, &local)?;
        let partial = set.partial_offset();
        let copied = if clip.unscales() || clip.reports_tensor_norms() {
            let end = if clip.reports_tensor_norms() {
                TENSORS_OFFSET + set.layout().len() as u64 * TENSOR_STAT_BYTES
            } else {
                partial + PARTIAL_BYTES
            };
            Copied {
                start: 0,
                len: end,
                loss_scale: clip.unscales(),
                tensor_norms: clip.reports_tensor_norms(),
            }
        } else {
            Copied {
                start: partial,
                len: PARTIAL_BYTES,
                loss_scale: false,
                tensor_norms: false,
            }
        };
        encoder.copy_buffer_to_buffer(
            set.stats_buffer(),
            copied.start,
            &self.readback,
            0,
            copied.len,
        );
        Ok(copied)
    }

    /// Starts mapping the copied bytes; call right after the submission that
    /// holds [`record_local`](Self::record_local).
    pub fn start_map(&self, copied: &Copied) {
        *self.mapped.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let mapped = self.mapped.clone();
        self.readback
            .map_async(wgpu::MapMode::Read, ..copied.len, move |result| {
                *mapped.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(result.map_err(|e| e.to_string()));
            });
    }

    /// Waits for `submission` (the host's one sync per step) and reads what
    /// [`start_map`](Self::start_map) maps.
    pub fn finish_read(
        &self,
        set: &GradSet,
        submission: wgpu::SubmissionIndex,
        copied: &Copied,
    ) -> gradclip::Result<Local> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission),
                timeout: None,
            })
            .map_err(|e| gradclip::Error::Readback(e.to_string()))?;
        self.take_map_result()?;
        // Unmapped whatever happens, so the next step can map it again.
        let local = self.read_mapped(set, copied);
        self.readback.unmap();
        local
    }

    fn read_mapped(&self, set: &GradSet, copied: &Copied) -> gradclip::Result<Local> {
        let view = self
            .readback
            .get_mapped_range(..copied.len)
            .map_err(|e| gradclip::Error::Readback(e.to_string()))?;
        let word = |at: u64| {
            let at = (at - copied.start) as usize;
            u32::from_le_bytes(view[at..at + 4].try_into().expect("4 bytes"))
        };
        let partial_at = (set.partial_offset() - copied.start) as usize;
        let bytes: [u8; 16] = view[partial_at..partial_at + 16]
            .try_into()
            .expect("16 bytes");
        Ok(Local {
            partial: NormPartial::from_bytes(bytes),
            loss_scale: copied
                .loss_scale
                .then(|| f32::from_bits(word(LOSS_SCALE_OFFSET))),
            tensor_norms: if copied.tensor_norms {
                (0..set.layout().len() as u64)
                    .map(|i| {
                        f32::from_bits(word(
                            TENSORS_OFFSET + i * TENSOR_STAT_BYTES + TENSOR_NORM_OFFSET,
                        ))
                    })
                    .collect()
            } else {
                Vec::new()
            },
        })
    }

    /// Whether the map started by [`start_map`](Self::start_map) succeeded,
    /// after a poll that waited for it.
    fn take_map_result(&self) -> gradclip::Result<()> {
        let state = self.mapped.lock().unwrap_or_else(|e| e.into_inner()).take();
        match state {
            Some(Ok(())) => Ok(()),
            Some(Err(message)) => Err(gradclip::Error::Readback(message)),
            None => Err(gradclip::Error::Readback(
                "the partial's map did not complete".into(),
            )),
        }
    }

    /// Records the clip of the local gradients with the combined partial
    /// (computing the coefficient, unscaling and updating the loss scale on
    /// the GPU exactly as a single process would).
    pub fn record_clip(
        &self,
        set: &GradSet,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
        combined: &NormPartial,
    ) -> gradclip::Result<()> {
        // Lands before the next submission, which is the first that can hold
        // the clip recorded below.
        self.queue
            .write_buffer(&self.combined, 0, &combined.to_bytes());
        set.clip_with_partial(encoder, clip, &self.combined, 0)
    }

    /// Records a per-tensor clip of the local tensors alone (each of them
    /// whole on this rank).
    pub fn record_local_clip(
        &self,
        set: &GradSet,
        encoder: &mut wgpu::CommandEncoder,
        clip: &ClipNorm,
    ) -> gradclip::Result<()> {
        set.clip_norm(encoder, clip)
    }
}

/// Bytes of the stats buffer a replicated set compares across ranks: the
/// clip state and the partial.
pub(crate) const STATE_AND_PARTIAL_BYTES: u64 = 64;

impl GpuStep {
    /// The clip state and partial the latest submitted clip left, read back
    /// now (submits a 64-byte copy and waits for it).
    pub fn read_state(&self, set: &GradSet) -> gradclip::Result<[u32; 16]> {
        let copied = Copied {
            start: 0,
            len: STATE_AND_PARTIAL_BYTES,
            loss_scale: false,
            tensor_norms: false,
        };
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("gradclip-mpi state readback"),
            });
        encoder.copy_buffer_to_buffer(set.stats_buffer(), 0, &self.readback, 0, copied.len);
        let submission = self.queue.submit([encoder.finish()]);
        self.start_map(&copied);
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission),
                timeout: None,
            })
            .map_err(|e| gradclip::Error::Readback(e.to_string()))?;
        self.take_map_result()?;
        let words = self
            .readback
            .get_mapped_range(..copied.len)
            .map(|view| bytemuck::pod_read_unaligned::<[u32; 16]>(&view[..]))
            .map_err(|e| gradclip::Error::Readback(e.to_string()));
        self.readback.unmap();
        words
    }
}
