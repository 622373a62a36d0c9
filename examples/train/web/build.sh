#!/usr/bin/env bash
# Builds the training demo's web page into examples/train/web/pkg/:
# the trainer compiled to wasm32 (wgpu's WebGPU back end) and its
# wasm-bindgen glue. Serve this folder on localhost afterwards, e.g.
#   python3 -m http.server --directory examples/train/web 8000
# and open http://localhost:8000/ in a browser with WebGPU.
# Needs: rustup target wasm32-unknown-unknown, and wasm-bindgen-cli at the
# version of wasm-bindgen in Cargo.lock.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cargo build --release --target wasm32-unknown-unknown --example train_web
wasm-bindgen --target web --no-typescript --out-dir examples/train/web/pkg \
    "$target_dir/wasm32-unknown-unknown/release/examples/train_web.wasm"
echo "built examples/train/web/pkg/ ($(du -sh examples/train/web/pkg | cut -f1))"
