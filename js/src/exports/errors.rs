//! Errors as JavaScript sees them: instances of the wrapper's
//! `GradclipError` class (registered at load time) with a stable `code`.

use std::cell::RefCell;

use js_sys::{Array, Function, Reflect};
use wasm_bindgen::prelude::*;

use crate::core_api::CoreError;
use crate::layout::LayoutError;

thread_local! {
    static ERROR_CLASS: RefCell<Option<Function>> = const { RefCell::new(None) };
}

/// Registers the constructor `new Class(code, message)` of the errors this
/// module throws (the wrapper's `GradclipError`). Called once by
/// `js/lib/index.js` after loading the module.
#[wasm_bindgen(js_name = setErrorClass)]
pub fn set_error_class(class: Function) {
    ERROR_CLASS.with(|c| *c.borrow_mut() = Some(class));
}

/// An error with `code` and `message`: a `GradclipError` once the wrapper
/// registered it, a plain `Error` with a `code` property before.
pub fn error(code: &str, message: impl AsRef<str>) -> JsValue {
    let message = message.as_ref();
    let class = ERROR_CLASS.with(|c| c.borrow().clone());
    if let Some(class) = class {
        let args = Array::of2(&JsValue::from_str(code), &JsValue::from_str(message));
        if let Ok(e) = Reflect::construct(&class, &args) {
            return e;
        }
    }
    let e = js_sys::Error::new(message);
    // Setting a property on a fresh Error cannot fail.
    let _ = Reflect::set(&e, &"code".into(), &code.into());
    e.into()
}

/// The error for options that are missing, unknown or of the wrong type.
pub fn invalid_options(method: &str, message: impl AsRef<str>) -> JsValue {
    error("INVALID_OPTIONS", format!("{method}: {}", message.as_ref()))
}

/// The error for using an object after `destroy()`.
pub fn destroyed(what: &str) -> JsValue {
    error(
        "DESTROYED",
        format!("this {what} was destroyed (destroy() was called on it or on its Clipper)"),
    )
}

impl From<CoreError> for JsValue {
    fn from(e: CoreError) -> Self {
        error(e.code, e.message)
    }
}

pub fn layout_error(e: LayoutError) -> JsValue {
    let code = match e {
        LayoutError::Empty => "EMPTY_LAYOUT",
        LayoutError::BadAlignment(_) => "INVALID_OPTIONS",
        LayoutError::Overflow => "LAYOUT_OVERFLOW",
    };
    error(code, format!("createGradients: {e}"))
}
