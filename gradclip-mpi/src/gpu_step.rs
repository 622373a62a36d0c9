//! The GPU side of a distributed step, and the only module that calls
//! gradclip's per-step API: record the local norm and bring back what the
//! exchange needs, then record the clip with the combined partial.
//!
//! What comes back is the 16-byte partial alone (`GradSet::read_partial`,
//! one 80-byte log entry copied in a submission made at the call, so the
//! copy is on its way while the caller does other host work), unless the
//! clip unscales or asks for per-tensor norms: then the step's report, which
//! also holds the loss scale and the pieces' norms.

use std::future::Future;
use std::pin::Pin;

use gradclip::{ClipNorm, GradSet, NormPartial};

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

type PartialFuture<'s> = Pin<Box<dyn Future<Output = gradclip::Result<(u64, NormPartial)>> + 's>>;

/// A local norm submitted, its readback started (or, for the report, to be
/// started when waited for).
pub(crate) enum LocalRead<'s> {
    Partial(PartialFuture<'s>),
    Report { step: u64 },
}

impl std::fmt::Debug for LocalRead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalRead::Partial(_) => f.write_str("LocalRead::Partial"),
            LocalRead::Report { step } => write!(f, "LocalRead::Report {{ step: {step} }}"),
        }
    }
}

/// The clip the local norm is recorded with: the stored values' norm (the
/// loss scale is updated once, by the final clip), never refusing (the
/// refusal is decided on the combined partial), per-tensor norms only when
/// the clip wants them.
fn local_clip(clip: &ClipNorm) -> ClipNorm {
    clip.unscale(false)
        .per_tensor(false)
        .error_if_nonfinite(false)
        .tensor_norms(clip.reports_tensor_norms())
}

/// Whether the step needs the report rather than the partial alone.
fn needs_report(clip: &ClipNorm) -> bool {
    clip.unscales() || clip.reports_tensor_norms()
}

/// Records the local norm into `encoder`, submits it on `queue` leaving
/// `fresh` in its place, and starts bringing back what the exchange needs.
/// On an error `encoder` is left as it was.
pub(crate) fn submit_local<'s>(
    set: &'s GradSet,
    queue: &wgpu::Queue,
    encoder: &mut wgpu::CommandEncoder,
    fresh: impl FnOnce() -> wgpu::CommandEncoder,
    clip: &ClipNorm,
) -> gradclip::Result<LocalRead<'s>> {
    set.record_norm(encoder, &local_clip(clip))?;
    let step = set.steps_recorded();
    let recorded = std::mem::replace(encoder, fresh());
    queue.submit([recorded.finish()]);
    Ok(if needs_report(clip) {
        LocalRead::Report { step }
    } else {
        // Submits the 80-byte copy now: it travels while the caller works.
        LocalRead::Partial(Box::pin(set.read_partial()))
    })
}

/// Waits for what [`submit_local`] started: the host's one sync per step.
pub(crate) fn finish_local(
    set: &GradSet,
    read: LocalRead<'_>,
    clip: &ClipNorm,
) -> gradclip::Result<Local> {
    match read {
        LocalRead::Partial(future) => {
            let (_, partial) = pollster::block_on(future)?;
            Ok(Local {
                partial,
                loss_scale: None,
                tensor_norms: Vec::new(),
            })
        }
        LocalRead::Report { step } => {
            let report = pollster::block_on(set.read_report())?;
            if report.step != step {
                // Another clip was recorded on the set in between.
                return Err(gradclip::Error::NotSubmitted);
            }
            Ok(Local {
                partial: report.partial,
                loss_scale: clip.unscales().then_some(report.loss_scale),
                tensor_norms: report.tensor_norms,
            })
        }
    }
}

/// Records the clip of the local gradients with the combined partial
/// (computing the coefficient, unscaling and updating the loss scale on the
/// GPU exactly as one process would). Per-tensor norms were already
/// gathered; a supplied total carries none.
pub(crate) fn record_clip(
    set: &GradSet,
    encoder: &mut wgpu::CommandEncoder,
    clip: &ClipNorm,
    combined: &NormPartial,
) -> gradclip::Result<()> {
    set.clip_with_partial(encoder, &clip.tensor_norms(false), combined)
}
