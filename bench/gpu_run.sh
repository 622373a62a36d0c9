#!/usr/bin/env bash
# There, on a lent GPU machine (the device tool's `run`, with .gl and .gpu
# carried; see bench/gpu_prepare.sh and docs/benchmark.md). In one call, since
# every start of that machine costs minutes of a short lease:
#   1. the gradclip bench on Vulkan: L2 and Inf over SIZES x 1/100/10 000
#      tensors, with and without tensor_norms, and the plain clip_norm timed
#      whole (gradclip.{md,json,svg});
#   2. the bench's other cases: p = 3 and 1.5, and 200 000 one-element
#      tensors (general.json, its table appended to gradclip.md);
#   3. the PyTorch peer on CUDA over the cases of 1 and 2 (torch.json) and the
#      comparison (compare.md);
#   4. the native test suite, if gpu_prepare.sh carried it (tests.log).
# Eight files come back at most: these seven and run.log. Each stage has its
# own time limit, so a stage that hangs costs its results, not the others'.
#   SIZES=1e7,1e8,2.5e8 (default)   BENCH_ARGS / TORCH_ARGS add options.
#   DRY_RUN=1: here, on any adapter, numpy for torch, no loader install (to
#   test this script before spending device time).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the results}
SIZES=${SIZES:-1e7,1e8,2.5e8}
log="$OUT/run.log"
export PYTHONUNBUFFERED=1
started=$SECONDS
stage() { echo "== [$((SECONDS - started)) s] $*" | tee -a "$log"; }

if [ "${DRY_RUN:-0}" = 1 ]; then
    require_gpu=
    torch=(--backend numpy)
    python=${PYTHON:-python3}
else
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    # --require-gpu: a CPU adapter (lavapipe, llvmpipe) is an error, never a result.
    require_gpu=--require-gpu
    torch=(--device cuda)
    python=python3
fi

{ date -u; uname -a; nvidia-smi; ldconfig -p | grep -E 'libvulkan|libEGL'; } >>"$log" 2>&1

# 16 roofline shapes instead of the bench's 108: on the H200 compiling all
# 108 per kind and size took most of a 200 s stage, and the winners there
# at 10^8 elements and above (vec4, 2 or 4 accumulators, 64 or 256
# invocations, 256 or 1024 workgroups, grid walk) are all among these.
# ROOF_ARGS= tunes them all.
roof=${ROOF_ARGS---roof-acc 2,4 --roof-wg 64,256 --roof-groups 256,1024 --roof-walks grid,invocation}

stage "bench: L2 and Inf, sizes $SIZES"
# shellcheck disable=SC2086
WGPU_BACKEND=vulkan timeout "${BENCH_LIMIT:-240}" .gpu/bench $require_gpu --sizes "$SIZES" \
    --norms l2,inf --tensor-norms --whole-step --no-cpu $roof ${BENCH_ARGS:-} \
    --json "$OUT/gradclip.json" --svg "$OUT/gradclip.svg" \
    >"$OUT/gradclip.md" 2>>"$log"
bench_rc=$?
stage "bench exit $bench_rc"

stage "bench: p = 3 and 1.5, and one-element tensors"
{ echo; echo "# General p and one-element tensors"; echo; } >>"$OUT/gradclip.md"
# shellcheck disable=SC2086
WGPU_BACKEND=vulkan timeout "${GENERAL_LIMIT:-150}" .gpu/bench $require_gpu --sizes "$SIZES" \
    --norms p3,p1.5 --one-element 200000 --no-cpu --naive none $roof ${BENCH_ARGS:-} \
    --json "$OUT/general.json" >>"$OUT/gradclip.md" 2>>"$log"
stage "bench (general p) exit $?"

stage "PyTorch peer"
# shellcheck disable=SC2086
timeout "${TORCH_LIMIT:-150}" "$python" bench/torch_peer.py "${torch[@]}" --sizes "$SIZES" \
    --norms l2,inf,p3,p1.5 ${TORCH_ARGS:-} --json "$OUT/torch.json" >>"$log" 2>&1
torch_rc=$?
stage "torch peer exit $torch_rc"

if [ $bench_rc = 0 ] && [ $torch_rc = 0 ]; then
    {
        "$python" bench/compare.py "$OUT/gradclip.json" "$OUT/torch.json"
        echo
        "$python" bench/compare.py "$OUT/general.json" "$OUT/torch.json"
    } >"$OUT/compare.md" 2>>"$log"
fi

if [ -x .gpu/native ]; then
    # The suite reads tests/data through the path it was built at.
    built_at=$(cat .gpu/built_at)
    if [ ! -e "$built_at" ]; then mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; fi
    stage "native test suite"
    WGPU_BACKEND=vulkan timeout "${TEST_LIMIT:-150}" .gpu/native >"$OUT/tests.log" 2>&1
    stage "native test suite exit $?"
fi
stage "done"
cat "$OUT/compare.md" 2>/dev/null
tail -n 3 "$OUT/tests.log" 2>/dev/null
[ $bench_rc = 0 ] && [ $torch_rc = 0 ]
