#!/usr/bin/env bash
# Builds the JavaScript package: the crate compiled to wasm32 (wgpu's WebGPU
# back end) and wasm-bindgen's ES-module glue, into js/wasm/. The package is
# then js/ itself (package.json, lib/, wasm/).
# Needs: rustup target wasm32-unknown-unknown, and wasm-bindgen-cli at the
# version of wasm-bindgen in Cargo.lock (js/ci.sh installs both).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cargo build --release --target wasm32-unknown-unknown -p gradclip-js
wasm-bindgen --target web --out-dir js/wasm --out-name gradclip_js \
    "$target_dir/wasm32-unknown-unknown/release/gradclip_js.wasm"
echo "built js/wasm/ ($(du -sh js/wasm | cut -f1); $(du -h js/wasm/gradclip_js_bg.wasm | cut -f1) of wasm)"
