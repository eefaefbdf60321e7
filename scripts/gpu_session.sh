#!/usr/bin/env bash
# One command on the GPU machine (device tool `run`, carry [".whl"], timeout_s 600): build pycuda from
# the carried sdist against the machine's CUDA, run the gpu test tier (the compiler suite on the cuda
# backend vs evaluate), then the benchmark harness (scripts/bench_gpu.py) in the time that is left.
# Everything lands under $OUT, at most 4 files, one folder deep:
#   gpu_session.log, gpu_tier.xml, results/<device>_<date>.json, results/<device>_<date>.md
# Wheels, the run() call and how to commit the results: benchmarks/README.md, section "GPU session".
# BENCH_ARGS overrides the harness's case selection (default: suite cases up to 300 MB of IO).
set -uo pipefail
OUT="${OUT:-/tmp/stitchfleet-out}"
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
CUDA_ROOT="$(dirname "$(dirname "$(command -v nvcc)")")"
export CUDA_ROOT PATH="$CUDA_ROOT/bin:$PATH"
LIMIT_S="${LIMIT_S:-600}"  # the run() call's timeout_s
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  python3 -m pip install -q --no-index --find-links .whl --no-build-isolation --target /tmp/site pycuda \
    || { echo "pycuda build failed"; exit 3; }
  export PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
  python3 -c "import pycuda.autoprimaryctx, pycuda.driver as d; print('pycuda sees', d.Context.get_device().name())"
  python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())"
  python3 -m pytest tests/compiler/runtime/test_cuda_backend.py tests/compiler/render \
    -q -rs --junitxml="$OUT/gpu_tier.xml"
  tier=$?
  # The harness starts no new case once its budget is spent; 90 s stay for the case in flight and the files.
  budget=$((LIMIT_S - SECONDS - 90))
  echo "gpu tier exit $tier after ${SECONDS}s; harness budget ${budget}s"
  if [ "$budget" -gt 30 ]; then
    # shellcheck disable=SC2086
    python3 scripts/bench_gpu.py ${BENCH_ARGS:---max-bytes 300e6} --time-budget "$budget" --out "$OUT/results"
    bench=$?
  else
    echo "no time left for the harness"; bench=4
  fi
  echo "gpu tier exit $tier, harness exit $bench, ${SECONDS}s"
  [ "$tier" -eq 0 ] && [ "$bench" -eq 0 ]
} 2>&1 | tee "$OUT/gpu_session.log"
exit "${PIPESTATUS[0]}"
