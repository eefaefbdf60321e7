#!/usr/bin/env bash
# Issue 33, item 4: what production runs, on a GPU machine without TensorFlow, in one call (device tool
# `run`, timeout_s 600; the image has nvcc, compute-sanitizer, cupy and CUDA's Python bindings; no pycuda):
#   1. the device and toolchain (nvidia-smi, nvcc, compute-sanitizer, cupy);
#   2. every suite cluster and workload cluster built as the TF GPU op builds it (NVRTC for the device's
#      arch, grid-barrier grids fitted to its real occupancy), run through the launch library on a
#      non-blocking stream with its non-finite checks, checked against `evaluate`, then timed with CUDA
#      events, L2 flushed before every timed run (scripts/bench_gpu_launch.py);
#   3. compute-sanitizer memcheck, racecheck and synccheck over a slice of those clusters, one checked run
#      each, in the time that is left (60 s kept for the files).
# Everything lands under $OUT: gpu_session.log, results/launch_<device>_<date>.json and .md.
#
# Usage: bash scripts/gpu_session.sh [--dry-run] [--limit SECONDS] [--bench-args "ARGS"] [--no-bench]
#   --dry-run        on any machine (CI): print the steps, check the files and options they need, plan and
#                    NVRTC-compile one case for sm_90 (no GPU, no cupy).
#   --limit S        the run() call's timeout_s (default $LIMIT_S or 600).
#   --bench-args A   bench_gpu_launch.py's case selection (default $BENCH_ARGS, empty: every case up to
#                    300 MB in and out).
#   --no-bench       checks only: step 2 runs each case once, untimed.
# Exit: 0 all passed; 1 a case or a sanitizer failed; 2 bad usage or missing files; 3 no GPU toolchain.
set -uo pipefail

RUNNER=scripts/bench_gpu_launch.py
# small clusters, with and without grid barriers: racecheck slows a kernel by orders of magnitude
SANITIZED=(--cases layernorm_fwd_128x768_f32 softmax_fwd_4096x256_f16 bert_encoder/cluster_05 transformer_block/cluster_07
  crnn_head/cluster_00 dien_attention_gru/cluster_21)
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-/tmp/stitchfleet-out}"
LIMIT_S="${LIMIT_S:-600}"
BENCH_ARGS="${BENCH_ARGS:-}"
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

[ -f "$RUNNER" ] || { echo "gpu_session.sh: missing $RUNNER (run from the repository root)" >&2; exit 2; }
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"

step() { echo "== step $1: $2"; }
timed_args() { if [ "$BENCH" -eq 1 ]; then echo "--time-budget $1"; else echo "--check-only"; fi; }

dry_run() {
  step 1 "device: nvidia-smi; nvcc --version; compute-sanitizer --version; import cupy (skipped in a dry run)"
  step 2 "clusters: $PYTHON $RUNNER $BENCH_ARGS $(timed_args '<budget>') --out $OUT/results (here: its dry run)"
  # The session's own options, then the dry run's: bad options fail here, not on the GPU.
  # shellcheck disable=SC2086
  "$PYTHON" "$RUNNER" $BENCH_ARGS --dry-run --out "$OUT/results" || return 1
  for tool in memcheck racecheck synccheck; do
    step 3 "compute-sanitizer --tool $tool --error-exitcode 9 $PYTHON $RUNNER --check-only ${SANITIZED[*]}"
  done
  "$PYTHON" "$RUNNER" --check-only "${SANITIZED[@]}" --dry-run --out "$(mktemp -d)" >/dev/null || return 1
  echo "dry run ok, ${SECONDS}s"
}

session() {
  step 1 "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || return 3
  nvcc --version | tail -2
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || echo "$(dirname "$(command -v nvcc)")/compute-sanitizer")"
  "$sanitizer" --version | head -1 || return 3
  "$PYTHON" -c "import cupy; print('cupy', cupy.__version__, cupy.cuda.runtime.getDeviceProperties(0)['name'])" \
    || return 3
  local budget=$(((LIMIT_S - SECONDS - 60) / 2))
  step 2 "clusters: checked, then timed for ${budget}s"
  # shellcheck disable=SC2086
  "$PYTHON" "$RUNNER" $BENCH_ARGS $(timed_args "$budget") --out "$OUT/results"
  local cases=$? sanitized=0
  local each=$(((LIMIT_S - SECONDS - 60) / 3))
  for tool in memcheck racecheck synccheck; do
    if [ "$each" -lt 20 ]; then echo "no time left for $tool"; sanitized=4; continue; fi
    step 3 "compute-sanitizer --tool $tool (${each}s)"
    timeout "$each" "$sanitizer" --tool "$tool" --error-exitcode 9 \
      "$PYTHON" "$RUNNER" --check-only "${SANITIZED[@]}" --out "$(mktemp -d)"
    local rc=$?
    echo "$tool exit $rc"
    [ "$rc" -eq 0 ] || sanitized=1
  done
  echo "clusters exit $cases, sanitizers exit $sanitized, ${SECONDS}s"
  [ "$cases" -eq 0 ] && [ "$sanitized" -eq 0 ] || return 1
}

if [ "$DRY" -eq 1 ]; then
  dry_run 2>&1 | tee "$OUT/gpu_session.log"
else
  session 2>&1 | tee "$OUT/gpu_session.log"
fi
exit "${PIPESTATUS[0]}"
