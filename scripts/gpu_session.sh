#!/usr/bin/env bash
# Issue 16, item 7, in one call on a GPU machine without TensorFlow (device tool `run`, carry [".whl"],
# timeout_s 600):
#   1. the device and toolchain (nvidia-smi, nvcc);
#   2. pycuda built from the carried sdist against the machine's CUDA (memory and streams for the tier);
#   3. the gpu tier: every suite case and every workload cluster through the launch library (the C
#      program runner the TF GPU op calls) against `evaluate`, the launch library's own GPU tests, and
#      the pycuda backend's;
#   4. the benchmark harness (scripts/bench_gpu.py: stitched vs per_op, XLA via JAX, torch.compile) in
#      the time that is left, 90 s kept for the case in flight and the files.
# Everything lands under $OUT (at most 4 files, one folder deep):
#   gpu_session.log, gpu_tier.xml, results/<device>_<date>.json, results/<device>_<date>.md
# Wheels, the run() call and how to commit the results: benchmarks/README.md, section "GPU session".
#
# Usage: bash scripts/gpu_session.sh [--dry-run] [--limit SECONDS] [--bench-args "ARGS"] [--no-bench]
#   --dry-run        on any machine (CI): print the steps, check the files they need, collect the gpu
#                    tier, run the harness's own dry run on one case; no GPU, no pycuda build.
#   --limit S        the run() call's timeout_s (default $LIMIT_S or 600): the harness gets what is left.
#   --bench-args A   the harness's case selection (default $BENCH_ARGS or "--max-bytes 300e6").
#   --no-bench       the tier only.
# Exit: 0 all passed; 1 a tier test or harness case failed; 2 bad usage or missing files; 3 no pycuda.
set -uo pipefail

TIER=(tests/compiler/targets/cuda/test_launch_program_gpu.py tests/compiler/targets/cuda/test_launch_library.py
  tests/compiler/targets/cuda/test_cuda_backend.py)
HARNESS=scripts/bench_gpu.py
DRY_CASE=softmax_fwd
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-/tmp/stitchfleet-out}"
LIMIT_S="${LIMIT_S:-600}"
BENCH_ARGS="${BENCH_ARGS:---max-bytes 300e6}"
DRY=0
BENCH=1

usage() { sed -n '/^# Usage:/,/^# Exit:/s/^# \{0,1\}//p' "$0"; }
fail_usage() { echo "gpu_session.sh: $1" >&2; usage >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --no-bench) BENCH=0 ;;
    --limit) [ $# -ge 2 ] || fail_usage "--limit needs a number of seconds"; LIMIT_S="$2"; shift ;;
    --bench-args) [ $# -ge 2 ] || fail_usage "--bench-args needs a value"; BENCH_ARGS="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) fail_usage "unknown argument: $1" ;;
  esac
  shift
done
case "$LIMIT_S" in ''|*[!0-9]*) fail_usage "--limit must be whole seconds, got '$LIMIT_S'" ;; esac
[ "$LIMIT_S" -ge 120 ] || fail_usage "--limit $LIMIT_S is too short for a session (at least 120)"

for needed in "${TIER[@]}" "$HARNESS"; do
  [ -f "$needed" ] || { echo "gpu_session.sh: missing $needed (run from the repository root)" >&2; exit 2; }
done
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

step() { echo "== step $1: $2"; }

dry_run() {
  step 1 "device: nvidia-smi; nvcc --version (skipped in a dry run)"
  step 2 "pycuda: $PYTHON -m pip install --no-index --find-links .whl --target /tmp/site pycuda (skipped)"
  step 3 "gpu tier: $PYTHON -m pytest ${TIER[*]} --junitxml=$OUT/gpu_tier.xml (collected only)"
  PYTHONPATH="$PWD:${PYTHONPATH:-}" "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider "${TIER[@]}" \
    | tail -1 || return 1
  if [ "$BENCH" -eq 1 ]; then
    step 4 "harness: $PYTHON $HARNESS $BENCH_ARGS --time-budget <left> (here: its dry run on $DRY_CASE)"
    # The session's own harness options, then the dry run's: bad options fail here, not on the GPU.
    # shellcheck disable=SC2086
    PYTHONPATH="$PWD:${PYTHONPATH:-}" "$PYTHON" "$HARNESS" $BENCH_ARGS --dry-run --cases "$DRY_CASE" \
      --out "$OUT/results" || return 1
  else
    step 4 "harness: skipped (--no-bench)"
  fi
  echo "dry run ok, ${SECONDS}s"
}

session() {
  step 1 "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  CUDA_ROOT="$(dirname "$(dirname "$(command -v nvcc)")")"
  export CUDA_ROOT PATH="$CUDA_ROOT/bin:$PATH"
  nvcc --version | tail -2
  step 2 "pycuda"
  "$PYTHON" -m pip install -q --no-index --find-links .whl --no-build-isolation --target /tmp/site pycuda \
    || { echo "pycuda build failed"; return 3; }
  export PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
  "$PYTHON" -c "import pycuda.autoprimaryctx, pycuda.driver as d; print('pycuda sees', d.Context.get_device().name())"
  "$PYTHON" -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())"
  step 3 "gpu tier"
  "$PYTHON" -m pytest "${TIER[@]}" -q -rs -p no:cacheprovider --junitxml="$OUT/gpu_tier.xml"
  local tier=$? bench=0
  local budget=$((LIMIT_S - SECONDS - 90))
  echo "gpu tier exit $tier after ${SECONDS}s; harness budget ${budget}s"
  if [ "$BENCH" -eq 0 ]; then
    step 4 "harness skipped (--no-bench)"
  elif [ "$budget" -gt 30 ]; then
    step 4 "harness"
    # shellcheck disable=SC2086
    "$PYTHON" "$HARNESS" $BENCH_ARGS --time-budget "$budget" --out "$OUT/results"
    bench=$?
  else
    echo "no time left for the harness"; bench=4
  fi
  echo "gpu tier exit $tier, harness exit $bench, ${SECONDS}s"
  [ "$tier" -eq 0 ] && [ "$bench" -eq 0 ] || return 1
}

if [ "$DRY" -eq 1 ]; then
  dry_run 2>&1 | tee "$OUT/gpu_session.log"
else
  session 2>&1 | tee "$OUT/gpu_session.log"
fi
exit "${PIPESTATUS[0]}"
