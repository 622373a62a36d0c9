#!/usr/bin/env bash
# CI for the JavaScript package (js/), run from the repository root: lints the
# crate natively and for wasm32, runs its unit tests, builds the package,
# type-checks the TypeScript declarations, runs the browser tests and the demo
# in headless Chromium (WebGPU on SwiftShader: no GPU needed), and keeps the
# demo's screenshot in target/js-demo.png. Installs what it needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    rustup target add wasm32-unknown-unknown
fi
if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ] || ! command -v python3 >/dev/null; then
    echo "== installing Chromium, chromedriver and python3"
    apt_install chromium chromium-driver python3
fi
if ! command -v npm >/dev/null; then
    echo "== installing node and npm"
    apt_install nodejs npm
fi
wasm_bindgen_version=$(awk '$0 == "name = \"wasm-bindgen\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $wasm_bindgen_version" ]; then
    echo "== installing wasm-bindgen-cli $wasm_bindgen_version"
    cargo install wasm-bindgen-cli --version "$wasm_bindgen_version" --locked \
        || cargo install wasm-bindgen-cli --version "$wasm_bindgen_version"
fi

echo "== js: format, lints (native and wasm32), unit tests"
cargo fmt --check -p gradclip-js
# With the core selected too, wgpu and naga get the features of the core's
# own lints and tests (.ci/run), whose build this then reuses; the core's
# part is already checked there, and its unit tests take a second.
cargo clippy --release -p gradclip -p gradclip-js --all-targets -- -D warnings
cargo clippy --release -p gradclip-js --target wasm32-unknown-unknown -- -D warnings
cargo test --release -p gradclip -p gradclip-js --lib

echo "== js: build the package, type-check its declarations"
js/build.sh
(cd js && npm ci --no-audit --no-fund --loglevel=error && npx --no-install tsc -p tsconfig.json)

echo "== js: browser tests in headless Chromium"
python3 js/tests/run.py

echo "== js: the demo in headless Chromium (short run on a small model)"
python3 js/demo/e2e_test.py --steps 100 --query "hidden=64&batch=16" --screenshot target/js-demo.png

echo "== js: CI passed in $((SECONDS - started)) s"
