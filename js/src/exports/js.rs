//! Building plain JavaScript objects and arrays.

use js_sys::{Array, Object, Reflect};
use wasm_bindgen::JsValue;

/// Named fields of an object, in order.
pub type Fields = Vec<(&'static str, JsValue)>;

/// A plain object with `fields`, in order.
pub fn object(fields: &[(&str, JsValue)]) -> JsValue {
    let o = Object::new();
    for (key, value) in fields {
        // Defining a property of a fresh plain object cannot fail.
        let _ = Reflect::set(&o, &JsValue::from_str(key), value);
    }
    o.into()
}

/// An array of numbers.
pub fn numbers(values: impl IntoIterator<Item = f32>) -> JsValue {
    values
        .into_iter()
        .map(|v| JsValue::from_f64(v as f64))
        .collect::<Array>()
        .into()
}
