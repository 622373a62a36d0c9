//! The golden cases of `tests/data/torch_clip_cases.json` (PyTorch 2.15 and
//! the TensorFlow formula), vendored into the repository; format in
//! `tests/data/README.md`.

use base64::Engine;
use serde_json::Value;

pub struct Case {
    pub kind: String,
    pub name: String,
    pub sizes: Vec<usize>,
    pub grads: Vec<f32>,
    pub raw: Value,
}

impl Case {
    pub fn f64(&self, key: &str) -> f64 {
        match &self.raw[key] {
            Value::String(s) if s == "inf" => f64::INFINITY,
            Value::String(s) if s == "nan" => f64::NAN,
            v => v
                .as_f64()
                .unwrap_or_else(|| panic!("{}: {key} is not a number: {v}", self.name)),
        }
    }

    pub fn floats(&self, key: &str) -> Vec<f32> {
        decode_floats(
            self.raw[key]
                .as_str()
                .unwrap_or_else(|| panic!("{}: no {key}", self.name)),
        )
    }

    pub fn has(&self, key: &str) -> bool {
        !self.raw[key].is_null()
    }

    /// `torch_total_norm`, stored as the bits of an f32.
    pub fn torch_total_norm(&self) -> Option<f32> {
        self.raw["torch_total_norm"]
            .as_u64()
            .map(|b| f32::from_bits(b as u32))
    }
}

fn decode_floats(b64: &str) -> Vec<f32> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(not(target_arch = "wasm32"))]
pub fn path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch_clip_cases.json")
}

#[cfg(not(target_arch = "wasm32"))]
pub fn cases() -> Vec<Case> {
    let text =
        std::fs::read_to_string(path()).unwrap_or_else(|e| panic!("{}: {e}", path().display()));
    parse(&text)
}

/// The golden file, compiled into the test binary: a browser has no file system.
#[cfg(target_arch = "wasm32")]
pub fn cases() -> Vec<Case> {
    parse(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/torch_clip_cases.json"
    )))
}

pub fn parse(text: &str) -> Vec<Case> {
    let json: Value = serde_json::from_str(text).expect("golden JSON");
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            kind: c["kind"].as_str().expect("kind").to_string(),
            name: c["name"].as_str().expect("name").to_string(),
            sizes: c["sizes"]
                .as_array()
                .expect("sizes")
                .iter()
                .map(|s| s.as_u64().unwrap() as usize)
                .collect(),
            grads: decode_floats(c["grads"].as_str().expect("grads")),
            raw: c.clone(),
        })
        .collect()
}
