#!/usr/bin/env bash
# There, on a lent GPU machine (the device tool's `run`, with .gl and .gpu
# carried; see bench/gpu_prepare.sh and docs/benchmark.md). Runs the gradclip
# bench on Vulkan and the PyTorch peer on CUDA over the same cases, and the
# comparison; writes 6 files under $OUT (the tool brings back at most 8):
# run.log, gradclip.md, gradclip.json, gradclip.svg, torch.json, compare.md.
#   MAX_N=1e8 (default)   largest size; BENCH_ARGS / TORCH_ARGS add options.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the results}
MAX_N=${MAX_N:-1e8}
log="$OUT/run.log"
export PYTHONUNBUFFERED=1

for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json

{ date -u; uname -a; nvidia-smi; ldconfig -p | grep -E 'libvulkan|libEGL'; } >"$log" 2>&1

# --require-gpu: a CPU adapter (lavapipe, llvmpipe) is an error, never a result.
# shellcheck disable=SC2086
WGPU_BACKEND=vulkan .gpu/bench --require-gpu --max-n "$MAX_N" ${BENCH_ARGS:-} \
    --json "$OUT/gradclip.json" --svg "$OUT/gradclip.svg" \
    >"$OUT/gradclip.md" 2>>"$log"
bench_rc=$?
echo "bench exit $bench_rc" >>"$log"

# shellcheck disable=SC2086
python3 bench/torch_peer.py --device cuda --max-n "$MAX_N" ${TORCH_ARGS:-} \
    --json "$OUT/torch.json" >>"$log" 2>&1
torch_rc=$?
echo "torch peer exit $torch_rc" >>"$log"

if [ $bench_rc = 0 ] && [ $torch_rc = 0 ]; then
    python3 bench/compare.py "$OUT/gradclip.json" "$OUT/torch.json" >"$OUT/compare.md" 2>>"$log"
fi
tail -n 30 "$log"
cat "$OUT/compare.md" 2>/dev/null
[ $bench_rc = 0 ] && [ $torch_rc = 0 ]
