//! The options objects of the JavaScript API, checked: unknown keys, wrong
//! types and out-of-domain strings are `INVALID_OPTIONS` errors naming the
//! method; numeric domains (a negative `maxNorm`, say) are the core's to
//! check, with their own codes.

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use wasm_bindgen::{JsCast, JsValue};

use super::errors::invalid_options;
use crate::core_api::{ClipSpec, NormOrder, ScalerSpec};
use crate::layout::Dtype;

/// Deserializes `value` (`undefined` and `null` give the defaults).
fn parse<T: for<'de> Deserialize<'de> + Default>(
    method: &str,
    value: JsValue,
) -> Result<T, JsValue> {
    if value.is_undefined() || value.is_null() {
        return Ok(T::default());
    }
    if !value.is_object() {
        return Err(invalid_options(method, "the options must be an object"));
    }
    serde_wasm_bindgen::from_value(value).map_err(|e| invalid_options(method, e.to_string()))
}

/// `createClipper(options)`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct CreateOptions {
    power_preference: Option<String>,
    limits: Option<String>,
    required_features: Option<Vec<String>>,
}

/// Which limits to request from the adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limits {
    /// Everything the adapter offers (large gradient buffers bind in few windows).
    Adapter,
    /// WebGPU's defaults (what every WebGPU device has).
    Default,
}

pub struct Create {
    pub power_preference: wgpu::PowerPreference,
    pub limits: Limits,
    /// `None`: `shader-f16` where the adapter has it.
    pub required_features: Option<Vec<(String, wgpu::Features)>>,
}

pub fn create(value: JsValue) -> Result<Create, JsValue> {
    const M: &str = "createClipper";
    let o: CreateOptions = parse(M, value)?;
    let power_preference = match o.power_preference.as_deref() {
        None => wgpu::PowerPreference::None,
        Some("low-power") => wgpu::PowerPreference::LowPower,
        Some("high-performance") => wgpu::PowerPreference::HighPerformance,
        Some(other) => {
            return Err(invalid_options(
                M,
                format!(
                    "powerPreference must be \"low-power\" or \"high-performance\", got {other:?}"
                ),
            ))
        }
    };
    let limits = match o.limits.as_deref() {
        None | Some("adapter") => Limits::Adapter,
        Some("default") => Limits::Default,
        Some(other) => {
            return Err(invalid_options(
                M,
                format!("limits must be \"adapter\" or \"default\", got {other:?}"),
            ))
        }
    };
    let required_features = o
        .required_features
        .map(|names| {
            names
                .into_iter()
                .map(|name| match wgpu::Features::from_name(&name) {
                    Some(f) => Ok((name, f)),
                    None => Err(invalid_options(
                        M,
                        format!("{name:?} is not a WebGPU feature name"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(Create {
        power_preference,
        limits,
        required_features,
    })
}

/// `named`: `{ name: size, ... }` (in insertion order) or `[[name, size], ...]`.
#[derive(Default)]
struct Named(Vec<(String, u64)>);

impl<'de> Deserialize<'de> for Named {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Named;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of { name: size } or an array of [name, size] pairs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Named, A::Error> {
                let mut v = Vec::new();
                while let Some(entry) = map.next_entry::<String, u64>()? {
                    v.push(entry);
                }
                Ok(Named(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Named, A::Error> {
                let mut v = Vec::new();
                while let Some(entry) = seq.next_element::<(String, u64)>()? {
                    v.push(entry);
                }
                Ok(Named(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// `createGradients(options)`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct GradientsOptions {
    sizes: Option<Vec<u64>>,
    named: Option<Named>,
    dtype: Option<String>,
    align: Option<u64>,
    label: Option<String>,
}

pub struct Gradients {
    pub sizes: Vec<u64>,
    pub names: Option<Vec<String>>,
    pub dtype: Dtype,
    pub align: u64,
    pub label: String,
}

pub fn gradients(value: JsValue) -> Result<Gradients, JsValue> {
    const M: &str = "createGradients";
    if value.is_undefined() || value.is_null() {
        return Err(invalid_options(
            M,
            "options with `sizes` or `named` are required",
        ));
    }
    let o: GradientsOptions = parse(M, value)?;
    let (sizes, names) = match (o.sizes, o.named) {
        (Some(sizes), None) => (sizes, None),
        (None, Some(Named(named))) => {
            let (names, sizes): (Vec<String>, Vec<u64>) = named.into_iter().unzip();
            (sizes, Some(names))
        }
        (Some(_), Some(_)) => return Err(invalid_options(M, "give `sizes` or `named`, not both")),
        (None, None) => return Err(invalid_options(M, "`sizes` or `named` is required")),
    };
    let dtype = match o.dtype.as_deref() {
        None => Dtype::F32,
        Some(name) => Dtype::from_name(name).ok_or_else(|| {
            invalid_options(
                M,
                format!("dtype must be \"f32\", \"f16\" or \"bf16\", got {name:?}"),
            )
        })?,
    };
    Ok(Gradients {
        sizes,
        names,
        dtype,
        align: o.align.unwrap_or(4),
        label: o.label.unwrap_or_else(|| "gradclip gradients".into()),
    })
}

/// `clipNorm(options)` and `recordNorm(options)`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct NormOptions {
    max_norm: Option<f32>,
    #[serde(with = "serde_wasm_bindgen::preserve")]
    norm: JsValue,
    semantics: Option<String>,
    error_if_nonfinite: bool,
    per_tensor: bool,
    tensor_norms: bool,
    unscale: bool,
}

/// `norm`: a positive number p (`Infinity` for the max norm), or `"inf"`.
fn norm_order(method: &str, norm: &JsValue) -> Result<NormOrder, JsValue> {
    if norm.is_undefined() || norm.is_null() {
        return Ok(NormOrder::L2);
    }
    if let Some(p) = norm.as_f64() {
        return Ok(match p {
            1.0 => NormOrder::L1,
            2.0 => NormOrder::L2,
            f64::INFINITY => NormOrder::Inf,
            // The core rejects p <= 0 and NaN (INVALID_NORM_ORDER).
            p => NormOrder::P(p as f32),
        });
    }
    match norm.as_string().as_deref() {
        Some("inf") | Some("Infinity") => Ok(NormOrder::Inf),
        _ => Err(invalid_options(
            method,
            format!("norm must be a positive number or \"inf\", got {norm:?}"),
        )),
    }
}

/// `max_norm_default`: what a missing `maxNorm` means (`None`: required).
pub fn norm(
    method: &str,
    value: JsValue,
    max_norm_default: Option<f32>,
) -> Result<ClipSpec, JsValue> {
    if (value.is_undefined() || value.is_null()) && max_norm_default.is_none() {
        return Err(invalid_options(
            method,
            "options with `maxNorm` are required",
        ));
    }
    let o: NormOptions = parse(method, value)?;
    let max_norm = o
        .max_norm
        .or(max_norm_default)
        .ok_or_else(|| invalid_options(method, "`maxNorm` is required"))?;
    let tensorflow = match o.semantics.as_deref() {
        None | Some("torch") => false,
        Some("tensorflow") => true,
        Some(other) => {
            return Err(invalid_options(
                method,
                format!("semantics must be \"torch\" or \"tensorflow\", got {other:?}"),
            ))
        }
    };
    Ok(ClipSpec {
        max_norm,
        norm: norm_order(method, &o.norm)?,
        tensorflow,
        error_if_nonfinite: o.error_if_nonfinite,
        per_tensor: o.per_tensor,
        tensor_norms: o.tensor_norms,
        unscale: o.unscale,
    })
}

/// `clipValue(options)`: `{ value }` (the range [-value, value], PyTorch's
/// `clip_grad_value_`) or `{ min, max }`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct ValueOptions {
    value: Option<f32>,
    min: Option<f32>,
    max: Option<f32>,
}

pub fn value_range(value: JsValue) -> Result<(f32, f32), JsValue> {
    const M: &str = "clipValue";
    let o: ValueOptions = parse(M, value)?;
    match (o.value, o.min, o.max) {
        (Some(v), None, None) => Ok((-v, v)),
        (None, Some(min), Some(max)) => Ok((min, max)),
        _ => Err(invalid_options(M, "give `value`, or both `min` and `max`")),
    }
}

/// `setLossScaler(options)`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct ScalerOptions {
    init_scale: Option<f32>,
    growth_factor: Option<f32>,
    backoff_factor: Option<f32>,
    growth_interval: Option<u32>,
}

pub fn scaler(value: JsValue) -> Result<ScalerSpec, JsValue> {
    let o: ScalerOptions = parse("setLossScaler", value)?;
    Ok(ScalerSpec {
        init_scale: o.init_scale,
        growth_factor: o.growth_factor,
        backoff_factor: o.backoff_factor,
        growth_interval: o.growth_interval,
    })
}

/// A partial: a `Uint8Array` (or any array-like of bytes) of length 16.
pub fn partial_bytes(method: &str, value: &JsValue) -> Result<[u8; 16], JsValue> {
    let bytes: Option<Vec<u8>> = if value.is_instance_of::<js_sys::Uint8Array>() {
        Some(js_sys::Uint8Array::from(value.clone()).to_vec())
    } else {
        None
    };
    bytes
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .ok_or_else(|| invalid_options(method, "a partial is a Uint8Array of 16 bytes"))
}

/// The `norm` of `combinePartials` and `partialTotalNorm` (default 2).
pub fn norm_only(method: &str, norm: &JsValue) -> Result<NormOrder, JsValue> {
    norm_order(method, norm)
}
