//! Every call into the gradclip core, behind types of this crate.
//!
//! The core's API is changing (v2: reports no longer copied per step,
//! `poll_reports`, `Reports { reports, dropped }`, `gradclip::wgsl::CLIP_STATE`).
//! Nothing else in this crate names a `gradclip::` item, so the switch
//! touches this file only. Until then `dropped` is counted here from the
//! gaps in the step numbers, and the ClipState declaration is kept here,
//! checked against the core's record layout by the unit test below.

use std::cell::Cell;

use gradclip::{ClipNorm, Clipper, GradLayout, GradSet, GradType, LossScaler, Norm};

use crate::layout::{Dtype, Placement};

/// A core error as the JavaScript side sees it: a stable code and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreError {
    pub code: &'static str,
    pub message: String,
}

pub type Result<T> = core::result::Result<T, CoreError>;

fn from_core(e: gradclip::Error) -> CoreError {
    use gradclip::Error as E;
    let code = match &e {
        E::InvalidMaxNorm(_) => "INVALID_MAX_NORM",
        E::InvalidNormOrder(_) => "INVALID_NORM_ORDER",
        E::InvalidClampRange { .. } => "INVALID_CLAMP_RANGE",
        E::EmptyLayout => "EMPTY_LAYOUT",
        E::LayoutOverflow => "LAYOUT_OVERFLOW",
        E::Unsupported(_) => "UNSUPPORTED",
        E::InvalidLossScaler(_) => "INVALID_LOSS_SCALER",
        E::TooLarge { .. } => "TOO_LARGE",
        E::UnsupportedDevice { .. } => "UNSUPPORTED_DEVICE",
        E::NonFinite { .. } => "NON_FINITE",
        E::NoReport => "NO_REPORT",
        E::NotSubmitted => "NOT_SUBMITTED",
        E::Readback(_) => "READBACK",
        E::Wgpu(_) => "GPU_ERROR",
        // The package makes the buffer and the ranges itself: these would
        // be bugs here, not misuse.
        E::OverlappingTensors { .. }
        | E::MisalignedTensor { .. }
        | E::RangeMismatch { .. }
        | E::LayoutExceedsBuffer { .. }
        | E::MissingUsage { .. } => "INTERNAL",
        _ => "INTERNAL",
    };
    CoreError {
        code,
        message: e.to_string(),
    }
}

/// The WGSL declaration of the clip state that
/// [`Bound::coefficient_binding`] points at (48 bytes), for a JavaScript
/// optimizer shader to paste and bind as `var<storage, read>`.
pub const CLIP_STATE_WGSL: &str = "\
// gradclip's clip state (48 bytes at offset 0 of the coefficient binding).
// Multiply the gradients by `coefficient` on load; skip the step when
// `nonfinite != 0u` with errorIfNonfinite, or when `found_inf != 0u` after an
// unscaling clip (`coefficient` is 1 then). `loss_scale` is the scale for the
// next backward pass.
struct ClipState {
    total_norm: f32,
    coefficient: f32,
    nonfinite: u32,
    scale_kind: u32,
    dispatch: array<u32, 3>,
    found_inf: u32,
    loss_scale: f32,
    unscaled_by: f32,
    growth_tracker: u32,
    _pad: u32,
}
";

/// Byte size of the ClipState record.
pub const CLIP_STATE_BYTES: u64 = 48;

/// The order of a norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormOrder {
    L1,
    L2,
    Inf,
    P(f32),
}

/// One norm clip (or norm measurement), as the options describe it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipSpec {
    pub max_norm: f32,
    pub norm: NormOrder,
    pub tensorflow: bool,
    pub error_if_nonfinite: bool,
    pub per_tensor: bool,
    pub tensor_norms: bool,
    pub unscale: bool,
}

impl ClipSpec {
    fn to_core(self) -> ClipNorm {
        let clip = if self.tensorflow {
            ClipNorm::tensorflow(self.max_norm)
        } else {
            ClipNorm::new(self.max_norm)
        };
        clip.norm(match self.norm {
            NormOrder::L1 => Norm::L1,
            NormOrder::L2 => Norm::L2,
            NormOrder::Inf => Norm::Inf,
            NormOrder::P(p) => Norm::P(p),
        })
        .error_if_nonfinite(self.error_if_nonfinite)
        .per_tensor(self.per_tensor)
        .tensor_norms(self.tensor_norms)
        .unscale(self.unscale)
    }
}

/// GradScaler's parameters; `None` keeps the default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScalerSpec {
    pub init_scale: Option<f32>,
    pub growth_factor: Option<f32>,
    pub backoff_factor: Option<f32>,
    pub growth_interval: Option<u32>,
}

/// What one norm clip found and did.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub step: u64,
    pub total_norm: f32,
    pub coefficient: f32,
    pub nonfinite: bool,
    pub found_inf: bool,
    pub unscaled_by: f32,
    pub loss_scale: f32,
    pub growth_tracker: u32,
    pub tensor_norms: Vec<f32>,
    pub tensor_coefficients: Vec<f32>,
}

impl From<gradclip::ClipReport> for Report {
    fn from(r: gradclip::ClipReport) -> Self {
        Report {
            step: r.step,
            total_norm: r.total_norm,
            coefficient: r.coefficient,
            nonfinite: r.nonfinite,
            found_inf: r.found_inf,
            unscaled_by: r.unscaled_by,
            loss_scale: r.loss_scale,
            growth_tracker: r.growth_tracker,
            tensor_norms: r.tensor_norms,
            tensor_coefficients: r.tensor_coefficients,
        }
    }
}

/// Every report that came back since the last take, and how many steps'
/// reports can no longer come (overwritten before anyone took them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reports {
    pub reports: Vec<Report>,
    pub dropped: u64,
}

/// The clipper of one device.
pub struct Engine {
    clipper: Clipper,
}

fn grad_type(dtype: Dtype) -> GradType {
    match dtype {
        Dtype::F32 => GradType::F32,
        Dtype::F16 => GradType::F16,
        Dtype::Bf16 => GradType::Bf16,
    }
}

impl Engine {
    /// Makes the pipelines on `device` (errors in them go to the device's
    /// error scopes: the caller pushes one around this call in the browser).
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<Self> {
        Ok(Self {
            clipper: Clipper::new(device, queue).map_err(from_core)?,
        })
    }

    /// Whether f16 gradients are read as `f16` (the device has `shader-f16`)
    /// rather than as packed words.
    pub fn f16_native(&self) -> bool {
        self.clipper.f16_path() == gradclip::ElementPath::F16Native
    }

    /// Binds `buffer`, laid out by `placement`, for every later clip.
    pub fn bind(
        &self,
        buffer: &wgpu::Buffer,
        placement: &Placement,
        names: Option<&[String]>,
    ) -> Result<Bound> {
        let sizes: Vec<usize> = placement
            .tensors
            .iter()
            .map(|t| usize::try_from(t.elements))
            .collect::<core::result::Result<_, _>>()
            .map_err(|_| from_core(gradclip::Error::LayoutOverflow))?;
        let layout = match names {
            Some(names) => {
                let named: Vec<(&str, usize)> =
                    names.iter().map(String::as_str).zip(sizes).collect();
                GradLayout::from_named(&named)
            }
            None => GradLayout::from_sizes(&sizes),
        }
        .map_err(from_core)?;
        let dtype = grad_type(placement.dtype);
        let ranges: Vec<(wgpu::BufferBinding<'_>, GradType)> = placement
            .tensors
            .iter()
            .map(|t| {
                let binding = wgpu::BufferBinding {
                    buffer,
                    offset: t.byte_offset,
                    // An empty tensor has no range: None ("the rest") is
                    // accepted for it and binds nothing.
                    size: wgpu::BufferSize::new(t.bytes(placement.dtype)),
                };
                (binding, dtype)
            })
            .collect();
        let set = self
            .clipper
            .bind_ranges_as(&layout, &ranges)
            .map_err(from_core)?;
        Ok(Bound {
            set,
            delivered: Cell::new(0),
        })
    }
}

/// A bound gradient buffer.
pub struct Bound {
    set: GradSet,
    /// The newest step whose report was taken, to count the dropped ones.
    delivered: Cell<u64>,
}

impl Bound {
    pub fn clip_norm(&self, encoder: &mut wgpu::CommandEncoder, spec: &ClipSpec) -> Result<()> {
        self.set
            .clip_norm(encoder, &spec.to_core())
            .map_err(from_core)
    }

    pub fn record_norm(&self, encoder: &mut wgpu::CommandEncoder, spec: &ClipSpec) -> Result<()> {
        self.set
            .record_norm(encoder, &spec.to_core())
            .map_err(from_core)
    }

    pub fn clip_value(&self, encoder: &mut wgpu::CommandEncoder, min: f32, max: f32) -> Result<()> {
        self.set.clip_value(encoder, min, max).map_err(from_core)
    }

    /// A `queue.write_buffer`: lands before the next submission.
    pub fn set_loss_scaler(&self, spec: &ScalerSpec) -> Result<()> {
        let mut scaler = LossScaler::new();
        if let Some(v) = spec.init_scale {
            scaler = scaler.init_scale(v);
        }
        if let Some(v) = spec.growth_factor {
            scaler = scaler.growth_factor(v);
        }
        if let Some(v) = spec.backoff_factor {
            scaler = scaler.backoff_factor(v);
        }
        if let Some(v) = spec.growth_interval {
            scaler = scaler.growth_interval(v);
        }
        self.set.set_loss_scaler(&scaler).map_err(from_core)
    }

    /// Every report back since the last call, oldest first; waits for the
    /// work submitted so far (today's core; v2 polls).
    pub async fn take_reports(&self) -> Result<Reports> {
        let taken = self.set.take_reports().await.map_err(from_core)?;
        let mut dropped = 0;
        let mut last = self.delivered.get();
        for r in &taken {
            dropped += r.step.saturating_sub(last + 1);
            last = last.max(r.step);
        }
        self.delivered.set(last);
        Ok(Reports {
            reports: taken.into_iter().map(Report::from).collect(),
            dropped,
        })
    }

    /// The report of the latest submitted norm clip.
    pub async fn latest_report(&self) -> Result<Report> {
        self.set
            .read_report()
            .await
            .map(Report::from)
            .map_err(from_core)
    }

    /// The buffer, offset and size of the ClipState record.
    pub fn coefficient_binding(&self) -> (&wgpu::Buffer, u64, u64) {
        let b = self.set.coefficient_binding();
        (
            b.buffer,
            b.offset,
            b.size.map_or(CLIP_STATE_BYTES, |s| s.get()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exported declaration has the core's ClipState layout, member by member.
    #[test]
    fn clip_state_wgsl_matches_the_core_record() {
        let module = naga::front::wgsl::parse_str(CLIP_STATE_WGSL).expect("valid WGSL");
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        let (handle, ty) = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some("ClipState"))
            .expect("struct ClipState");
        let naga::TypeInner::Struct { members, span } = &ty.inner else {
            panic!("ClipState is not a struct");
        };
        let (_, size, fields) = gradclip::records::layouts()
            .into_iter()
            .find(|(name, _, _)| *name == "ClipState")
            .expect("the core has a ClipState record");
        assert_eq!(*span as usize, size);
        assert_eq!(layouter[handle].size as u64, CLIP_STATE_BYTES);
        let ours: Vec<(&str, usize)> = members
            .iter()
            .map(|m| (m.name.as_deref().unwrap(), m.offset as usize))
            .collect();
        assert_eq!(ours, fields);
    }

    #[test]
    fn core_errors_get_stable_codes() {
        let e = from_core(gradclip::Error::InvalidMaxNorm(-1.0));
        assert_eq!(e.code, "INVALID_MAX_NORM");
        assert!(e.message.contains("-1"), "{}", e.message);
        assert_eq!(from_core(gradclip::Error::NoReport).code, "NO_REPORT");
        assert_eq!(
            from_core(gradclip::Error::NonFinite {
                total_norm: f32::NAN
            })
            .code,
            "NON_FINITE"
        );
    }

    #[test]
    fn clip_specs_reach_the_core_unchanged() {
        let spec = ClipSpec {
            max_norm: 2.5,
            norm: NormOrder::P(3.0),
            tensorflow: true,
            error_if_nonfinite: true,
            per_tensor: false,
            tensor_norms: true,
            unscale: true,
        };
        let c = spec.to_core();
        assert_eq!(c.max_norm(), 2.5);
        assert_eq!(c.norm_order(), Norm::P(3.0));
        assert_eq!(c.semantics(), gradclip::Semantics::TensorFlow);
        assert!(c.errors_if_nonfinite() && c.reports_tensor_norms() && c.unscales());
        assert!(!c.is_per_tensor());
    }
}
