//! What JavaScript sees (wasm32 only). `js/lib/index.js` wraps it: it loads
//! the module, registers `GradclipError`, and re-exports `createClipper`.

mod clipper;
mod errors;
mod gradients;
mod js;
mod options;

use wasm_bindgen::prelude::*;

/// The WGSL declaration of the record behind `Gradients.coefficientBinding`
/// (`js/lib/index.js` exports the same text as `CLIP_STATE_WGSL`; a browser
/// test checks they agree).
#[wasm_bindgen(js_name = clipStateWgsl)]
pub fn clip_state_wgsl() -> String {
    crate::core_api::CLIP_STATE_WGSL.to_string()
}
