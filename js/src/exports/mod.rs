//! What JavaScript sees (wasm32 only). `js/lib/index.js` wraps it: it loads
//! the module, registers `GradclipError`, and re-exports `createClipper`.

mod clipper;
mod errors;
mod gradients;
mod js;
mod options;

use js_sys::{Array, Uint8Array};
use wasm_bindgen::prelude::*;

use crate::core_api;

/// The WGSL of the record behind `Gradients.coefficientBinding`: gradclip's
/// own `struct ClipState` and `clip_apply(g, clip)`, verbatim
/// (`js/lib/index.js` exports it as `CLIP_STATE_WGSL`).
#[wasm_bindgen(js_name = clipStateWgsl)]
pub fn clip_state_wgsl() -> String {
    core_api::CLIP_STATE_WGSL.to_string()
}

/// Byte size of the ClipState record.
#[wasm_bindgen(js_name = clipStateBytes)]
pub fn clip_state_bytes() -> f64 {
    core_api::CLIP_STATE_BYTES as f64
}

/// Reports kept on the GPU between reads.
#[wasm_bindgen(js_name = reportLogLength)]
pub fn report_log_length() -> f64 {
    core_api::REPORT_LOG_LEN as f64
}

/// The partial of all `partials` (16-byte `Uint8Array`s of one norm order).
#[wasm_bindgen(js_name = combinePartials)]
pub fn combine_partials(partials: Array, norm: JsValue) -> Result<Uint8Array, JsValue> {
    const M: &str = "combinePartials";
    let norm = options::norm_only(M, &norm)?;
    let parts = partials
        .iter()
        .map(|p| options::partial_bytes(M, &p))
        .collect::<Result<Vec<_>, _>>()?;
    let combined = core_api::combine_partials(&parts, norm)?;
    Ok(Uint8Array::from(&combined[..]))
}

/// The norm a partial stands for, in float64.
#[wasm_bindgen(js_name = partialTotalNorm)]
pub fn partial_total_norm(partial: JsValue, norm: JsValue) -> Result<f64, JsValue> {
    const M: &str = "partialTotalNorm";
    let norm = options::norm_only(M, &norm)?;
    let bytes = options::partial_bytes(M, &partial)?;
    Ok(core_api::partial_total_norm(bytes, norm)?)
}
