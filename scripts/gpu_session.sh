#!/usr/bin/env bash
# One command on the GPU machine (device tool `run`, carry [".whl"]): build pycuda from the carried
# sdist against the machine's CUDA, then run the gpu test tier (the compiler suite on the cuda
# backend vs evaluate). Everything it reports lands under $OUT (log + junit XML).
# Wheels: see benchmarks/README.md, section "GPU session".
set -uo pipefail
OUT="${OUT:-/tmp/stitchfleet-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CUDA_ROOT="$(dirname "$(dirname "$(command -v nvcc)")")"
export CUDA_ROOT PATH="$CUDA_ROOT/bin:$PATH"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
  python3 -m pip install -q --no-index --find-links .whl --no-build-isolation --target /tmp/site pycuda \
    || { echo "pycuda build failed"; exit 3; }
  export PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
  python3 -c "import pycuda.autoprimaryctx, pycuda.driver as d; print('pycuda sees', d.Context.get_device().name())"
  python3 -m pytest tests/compiler/runtime/test_cuda_backend.py tests/compiler/render \
    -q -rs --junitxml="$OUT/gpu_tier.xml"
} 2>&1 | tee "$OUT/gpu_session.log"
exit "${PIPESTATUS[0]}"
