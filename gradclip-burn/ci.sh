#!/usr/bin/env bash
# CI for gradclip-burn, run from the repository root (or anywhere: it cd's
# there): formatting, then the tests on Mesa's lavapipe (Vulkan) and a short
# run of the example, side by side (.ci/side-by-side). burn takes most of
# CI's time budget to compile on two cores, so CI leaves out clippy (a
# second, check-mode build of burn; run
# `cargo clippy -p gradclip-burn --all-targets -- -D warnings` locally) and
# the GL run of the clip tests
# (`WGPU_BACKEND=gl cargo test -p gradclip-burn --test clip`). Installs
# lavapipe when it is missing. The tests fail, not skip, when there is no
# adapter.
set -euo pipefail
cd "$(dirname "$0")/.."

# Mesa complains on every device creation without a runtime directory.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
    XDG_RUNTIME_DIR=$(mktemp -d)
    export XDG_RUNTIME_DIR
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
    echo "== installing Mesa's Vulkan drivers (lavapipe)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq mesa-vulkan-drivers >/dev/null
fi

started=$SECONDS
echo "== gradclip-burn: format"
cargo fmt -p gradclip-burn --check

# The test binaries and the example run side by side: each keeps about one
# core busy (burn's code generation, unoptimised here, and lavapipe's
# compiles of its kernels, on one thread), and one after the other they
# took 306 s (clip 161, f16 144) plus the example's 78 on a slow 2-core
# host, side by side 139 s. Each test binary's tests still run one at a
# time (common::serial).
echo "== gradclip-burn: build its tests and example"
cargo test -p gradclip-burn --no-run
echo "== gradclip-burn: tests on WGPU_BACKEND=vulkan (lavapipe) and a short run of the example, side by side"
# Every file of tests/ is a test binary of its own, found here, so that a
# new one cannot be left out.
jobs=(unit-and-doc-tests 'cargo test -p gradclip-burn --lib && cargo test -p gradclip-burn --doc')
for file in gradclip-burn/tests/*.rs; do
    name=$(basename "$file" .rs)
    jobs+=("test-$name" "WGPU_BACKEND=vulkan cargo test -p gradclip-burn --test $name")
done
jobs+=(example 'WGPU_BACKEND=vulkan cargo run -p gradclip-burn --example explode -- --steps 15 --plot target/gradclip-burn-explode.svg')
.ci/side-by-side target/ci-burn "${jobs[@]}"

echo "== gradclip-burn passed in $((SECONDS - started)) s"
