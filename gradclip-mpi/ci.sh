#!/usr/bin/env bash
# CI for gradclip-mpi, run from anywhere (it works from the repository root):
# installs Debian's OpenMPI (and libclang, which rsmpi's bindings are
# generated with) when missing, then lints the crate, runs its unit and doc
# tests and the multi-process suite (tests/ranks.rs runs itself under
# `mpirun -np 2` and `-np 4` on lavapipe), and the sharded training example
# on 4 ranks, which fails if its loss leaves the single-process run's.
set -euo pipefail
cd "$(dirname "$0")/.."

# Mesa logs an error per device without a runtime directory; give it one.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
    XDG_RUNTIME_DIR=$(mktemp -d)
    export XDG_RUNTIME_DIR
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for package in openmpi-bin libopenmpi-dev libclang-dev mesa-vulkan-drivers; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

mpirun_flags=(--oversubscribe)
if [ "$(id -u)" = 0 ]; then
    mpirun_flags+=(--allow-run-as-root)
fi

echo "== gradclip-mpi: format and lints"
cargo fmt --check -p gradclip-mpi
cargo clippy --release -p gradclip-mpi --all-targets -- -D warnings

echo "== gradclip-mpi: unit, doc and multi-process tests (WGPU_BACKEND=vulkan)"
WGPU_BACKEND=vulkan cargo test --release -p gradclip-mpi

echo "== gradclip-mpi: sharded MLP on 4 ranks against one process"
cargo build --release -p gradclip-mpi --example sharded_mlp
WGPU_BACKEND=vulkan timeout --kill-after=10 600 \
    mpirun "${mpirun_flags[@]}" -np 4 "${CARGO_TARGET_DIR:-target}/release/examples/sharded_mlp" --steps 200 --every 50

echo "== gradclip-mpi CI passed"
