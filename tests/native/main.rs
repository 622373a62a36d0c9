//! Every native test in one binary. Each test process makes its device and
//! compiles the pipelines it uses once, and SwiftShader's compiler takes
//! seconds per pipeline: twenty binaries paid that twenty times on every
//! driver, and linked wgpu twenty times. The browser tests stay one per
//! binary (tests/web_*.rs, tests/adaptive_web.rs): a panic there aborts the
//! whole wasm instance.
//!
//! One module runs with `cargo test --test native <module>::`.

#[path = "../common/mod.rs"]
mod common;

mod adaptive;
mod adaptive_reference;
mod api;
mod breadth;
mod chunks;
mod configs;
mod determinism;
mod division;
mod extremes;
mod flat_walk;
mod fused_sgd;
mod golden;
mod misuse;
mod mixed;
mod numerics;
mod partials;
mod quads;
mod random_layouts;
mod rebind;
mod reports;
mod shaders;
mod threads;
mod timed;
