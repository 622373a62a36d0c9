#!/usr/bin/env bash
# Here, on the build machine (no GPU): gets everything a lent GPU machine
# needs to run the benchmark and its PyTorch peer, into two ignored folders
# that the device tool carries: .gl (the Vulkan loader and GL dispatch
# libraries as .debs, from Debian's amd64 archive) and .gpu (the bench binary,
# and the native test suite, built here, since that machine has no Rust
# toolchain).
# Then: device run, carry [".gl", ".gpu"], command "bash bench/gpu_run.sh".
set -euo pipefail
cd "$(dirname "$0")/.."

# Both folders are in .gitignore, so they travel only when carried.
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
    mkdir -p .gl /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -qq
    # shellcheck disable=SC2086
    (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi

cargo build --release --example bench
mkdir -p .gpu
cp target/release/examples/bench .gpu/bench
# The native test suite too (one binary), with the path it reads tests/data
# from, so that the run can check gradclip on that GPU's driver.
suite=$(cargo test --release --no-run --test native --message-format=json 2>/dev/null \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "native" and m.get("executable"):
        print(m["executable"])')
cp "$suite" .gpu/native
pwd >.gpu/built_at
du -sh .gl .gpu
# What the device tool sends: the tracked files, the untracked ones git
# does not ignore, and the carried folders. It refuses more than 64 MiB,
# so say so here rather than with a failed call. (docs/bench-runs/ is
# committed gzipped for this: plain, its JSON alone took 43 MB.)
travel=$({
    git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true
    find .gl .gpu -type f -exec stat -c %s {} +
} | awk '{ s += $1 } END { print s + 0 }')
limit=$((64 * 1024 * 1024))
echo "the working tree and .gl, .gpu: $((travel / 1048576)) MiB of the device tool's 64"
if [ "$travel" -gt "$limit" ]; then
    echo "over the device tool's limit: gzip new JSON in docs/bench-runs, or carry less" >&2
    exit 1
fi
echo "ready: device run with carry [\".gl\", \".gpu\"] and command 'bash bench/gpu_run.sh'"
