//! Every call into the gradclip core, behind types of this crate: the one
//! module to change when the core's API changes.

use gradclip::{ClipNorm, Clipper, GradLayout, GradSet, GradType, LossScaler, Norm, NormPartial};

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
        E::InvalidPartial(_) => "INVALID_PARTIAL",
        E::TooLarge { .. } => "TOO_LARGE",
        E::UnsupportedDevice { .. } => "UNSUPPORTED_DEVICE",
        E::NonFinite { .. } => "NON_FINITE",
        E::NoReport => "NO_REPORT",
        E::NotSubmitted => "NOT_SUBMITTED",
        E::Readback(_) => "READBACK",
        E::DeviceLost(_) => "DEVICE_LOST",
        E::BufferDestroyed { .. } => "DESTROYED",
        E::Wgpu(_) => "GPU_ERROR",
        // The package makes the buffer, its usages and the ranges itself,
        // and never maps it: these would be bugs here, not misuse.
        _ => "INTERNAL",
    };
    CoreError {
        code,
        message: e.to_string(),
    }
}

/// The WGSL of the record behind [`Bound::coefficient_binding`]: the core's
/// own `struct ClipState` and `clip_apply(g, clip)`, verbatim.
pub const CLIP_STATE_WGSL: &str = gradclip::wgsl::CLIP_STATE;

/// Byte size of the ClipState record.
pub const CLIP_STATE_BYTES: u64 = size_of::<gradclip::records::ClipState>() as u64;

/// Reports the core keeps on the GPU between reads: reading at least this
/// often loses none.
pub const REPORT_LOG_LEN: u64 = gradclip::records::LOG_LEN;

/// The order of a norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormOrder {
    L1,
    L2,
    Inf,
    P(f32),
}

impl NormOrder {
    fn to_core(self) -> Norm {
        match self {
            NormOrder::L1 => Norm::L1,
            NormOrder::L2 => Norm::L2,
            NormOrder::Inf => Norm::Inf,
            NormOrder::P(p) => Norm::P(p),
        }
    }
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
        clip.norm(self.norm.to_core())
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

/// A shard's 16-byte share of a norm, checked to be bits a reduction can make.
pub fn partial_from_bytes(bytes: [u8; 16]) -> Result<NormPartial> {
    NormPartial::from_bytes(bytes).map_err(from_core)
}

/// The partial of all `parts` (an all-reduce done on the host).
pub fn combine_partials(parts: &[[u8; 16]], norm: NormOrder) -> Result<[u8; 16]> {
    let parts = parts
        .iter()
        .map(|b| partial_from_bytes(*b))
        .collect::<Result<Vec<_>>>()?;
    NormPartial::combine(&parts, norm.to_core())
        .map(|p| p.to_bytes())
        .map_err(from_core)
}

/// The norm a partial stands for, in float64.
pub fn partial_total_norm(bytes: [u8; 16], norm: NormOrder) -> Result<f64> {
    partial_from_bytes(bytes)?
        .total_norm(norm.to_core())
        .map_err(from_core)
}

/// What one norm clip found and did.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub step: u64,
    pub total_norm: f32,
    pub coefficient: f32,
    pub nonfinite: bool,
    pub found_inf: bool,
    pub invalid_partial: bool,
    pub unscaled_by: f32,
    pub loss_scale: f32,
    pub growth_tracker: u32,
    pub partial: [u8; 16],
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
            invalid_partial: r.invalid_partial,
            unscaled_by: r.unscaled_by,
            loss_scale: r.loss_scale,
            growth_tracker: r.growth_tracker,
            partial: r.partial.to_bytes(),
            tensor_norms: r.tensor_norms,
            tensor_coefficients: r.tensor_coefficients,
        }
    }
}

/// Reports collected by a read: every report since the previous collection,
/// oldest first, and how many steps' reports are lost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reports {
    pub reports: Vec<Report>,
    pub dropped: u64,
    pub tensor_norms_missed: u64,
}

impl From<gradclip::Reports> for Reports {
    fn from(r: gradclip::Reports) -> Self {
        Reports {
            reports: r.reports.into_iter().map(Report::from).collect(),
            dropped: r.dropped,
            tensor_norms_missed: r.tensor_norms_missed,
        }
    }
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
        Ok(Bound { set })
    }
}

/// A bound gradient buffer.
pub struct Bound {
    set: GradSet,
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

    /// Clips with a norm combined elsewhere (other shards' partials and
    /// this one's): the bytes are checked before anything is recorded.
    pub fn clip_with_partial(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        spec: &ClipSpec,
        partial: [u8; 16],
    ) -> Result<()> {
        let partial = partial_from_bytes(partial)?;
        self.set
            .clip_with_partial(encoder, &spec.to_core(), &partial)
            .map_err(from_core)
    }

    pub fn clip_value(&self, encoder: &mut wgpu::CommandEncoder, min: f32, max: f32) -> Result<()> {
        self.set.clip_value(encoder, min, max).map_err(from_core)
    }

    /// Norm clips recorded so far: the step number of the latest.
    pub fn steps_recorded(&self) -> u64 {
        self.set.steps_recorded()
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

    /// The reports whose readback is back, without waiting; starts a read
    /// of the steps since the last one for a later call.
    pub fn poll_reports(&self) -> Result<Reports> {
        self.set
            .poll_reports()
            .map(Reports::from)
            .map_err(from_core)
    }

    /// Every report since the last collection, once a copy of the log
    /// submitted now is back (later submissions are not waited for).
    pub async fn take_reports(&self) -> Result<Reports> {
        self.set
            .take_reports()
            .await
            .map(Reports::from)
            .map_err(from_core)
    }

    /// The report of the latest submitted norm clip.
    pub async fn latest_report(&self) -> Result<Report> {
        self.set
            .read_report()
            .await
            .map(Report::from)
            .map_err(from_core)
    }

    /// The step and 16-byte partial of the latest norm clip; the copy is
    /// submitted when this is called.
    pub fn read_partial(&self) -> impl core::future::Future<Output = Result<(u64, [u8; 16])>> + '_ {
        let read = self.set.read_partial();
        async move {
            read.await
                .map(|(step, p)| (step, p.to_bytes()))
                .map_err(from_core)
        }
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
        assert_eq!(
            from_core(gradclip::Error::InvalidPartial("x")).code,
            "INVALID_PARTIAL"
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

    #[test]
    fn the_exported_clip_state_is_the_core_record() {
        assert_eq!(CLIP_STATE_BYTES, 64);
        assert!(CLIP_STATE_WGSL.contains("struct ClipState"));
        assert!(CLIP_STATE_WGSL.contains("fn clip_apply("));
    }

    #[test]
    fn partials_combine_and_reject_garbage() {
        // Two L2 shards of norms 3 and 4: the combined norm is 5.
        let shard = |v: f32| {
            let mut b = [0u8; 16];
            b[4..8].copy_from_slice(&(v * v).to_le_bytes());
            b
        };
        let (a, b) = (shard(3.0), shard(4.0));
        let combined = combine_partials(&[a, b], NormOrder::L2).unwrap();
        let norm = partial_total_norm(combined, NormOrder::L2).unwrap();
        assert!((norm - 5.0).abs() < 1e-6, "{norm}");
        let mut bad = [0u8; 16];
        bad[12] = 0x40;
        assert_eq!(partial_from_bytes(bad).unwrap_err().code, "INVALID_PARTIAL");
    }
}
