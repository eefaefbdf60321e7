"""cuda-cpu's checks fire on deliberately broken hand-written CUDA kernels and stay quiet on their fixes.

Each kernel is one tiny `extern "C" __global__` text (64 threads, one block) launched with the
backend's contract in the checked build. What a GPU would not report: a barrier reached by part
of a block, a `*_sync` mask naming an exited lane, a shuffle reading outside its mask, a
misaligned vector access, a read of shared memory no thread wrote (a different result when
shared memory starts as 0x00 instead of 0xff), a missing barrier (a different result with
the fibers in another legal order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import Buffer, Launch, Role
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuError, CudaCpuOptions, CudaCpuProgram
from stitchfleet.compiler.targets.cuda_cpu.module import load_kernel

# one xdist worker runs the module, so that `cache` builds a kernel text once (each build: seconds of g++)
pytestmark = [pytest.mark.cuda_cpu, pytest.mark.xdist_group("cuda_cpu_diagnostics")]

X = Buffer("x", DType.F32, 64, Role.INPUT)
Y = Buffer("y", DType.F32, 64, Role.OUTPUT)
INPUT = np.arange(64, dtype=np.float32)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the module: a kernel text is built once (a checked g++ build, seconds), however many tests
    run it; fill and fiber order are run-time options, not part of the build. Each test's own tmp_path built the
    misaligned fix and both missing-barrier kernels twice."""
    return tmp_path_factory.mktemp("cuda-cpu-diagnostics")


def _run(cache: Path, body: str, *, order: int = 0, fill: int = 0xFF, smem: int = 0) -> npt.NDArray[Any]:
    source = f'extern "C" __global__ void k(const float* x, float* y) {{\n{body}\n}}\n'
    kernel = CudaKernel("k", source, (X, Y), Launch(1, 64, 1), False, smem, 0)
    options = CudaCpuOptions(cache, debug=True, order=order, fill=fill)
    program = CudaCpuProgram([(kernel, load_kernel(kernel, options))], {"x": X, "y": Y}, options)
    result: npt.NDArray[Any] = program({"x": INPUT})["y"]
    return result


def test_a_correct_kernel_runs(cache: Path) -> None:
    body = "  y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1, 32);"
    np.testing.assert_array_equal(_run(cache, body), INPUT.reshape(-1, 2)[:, ::-1].reshape(-1))


# (what, broken body, fixed body, the message the broken one aborts with)
ABORTS = [
    (
        "barrier reached by part of a block",
        "  if (threadIdx.x < 10) return;\n  __syncthreads();\n  y[threadIdx.x] = x[threadIdx.x];",
        "  __syncthreads();\n  if (threadIdx.x < 10) return;\n  y[threadIdx.x] = x[threadIdx.x];",
        "part of a block",
    ),
    (
        "mask naming an exited lane",
        "  if (threadIdx.x == 3) return;\n  y[threadIdx.x] = __shfl_sync(0xffffffffu, x[threadIdx.x], 0, 32);",
        "  if (threadIdx.x == 3) return;\n"
        "  unsigned m = threadIdx.x < 32 ? 0xfffffff7u : 0xffffffffu;\n"
        "  y[threadIdx.x] = __shfl_sync(m, x[threadIdx.x], 0, 32);",
        "exited",
    ),
    (
        "shuffle reading a lane outside its mask",
        "  if (threadIdx.x < 16) y[threadIdx.x] = __shfl_sync(0x0000ffffu, x[threadIdx.x], 20, 32);",
        "  if (threadIdx.x < 16) y[threadIdx.x] = __shfl_sync(0x0000ffffu, x[threadIdx.x], 12, 32);",
        "outside its mask",
    ),
    (
        "misaligned vector access",
        "  if (threadIdx.x < 15) {\n"
        "    sf_vec<float, 4> v = *reinterpret_cast<const sf_vec<float, 4>*>(x + 4 * threadIdx.x + 1);\n"
        "    y[threadIdx.x] = v.v[0];\n  }",
        "  if (threadIdx.x < 15) {\n"
        "    sf_vec<float, 4> v = *reinterpret_cast<const sf_vec<float, 4>*>(x + 4 * threadIdx.x);\n"
        "    y[threadIdx.x] = v.v[1];\n  }",
        "misaligned access at k.cu:3.*16-byte alignment",
    ),
]


@pytest.mark.parametrize(("broken", "fixed", "message"), [a[1:] for a in ABORTS], ids=[a[0] for a in ABORTS])
def test_check_fires_on_the_broken_kernel_only(cache: Path, broken: str, fixed: str, message: str) -> None:
    with pytest.raises(CudaCpuError, match=message):
        _run(cache, broken)
    _run(cache, fixed)  # quiet: no CudaCpuError


def test_misaligned_fix_reads_what_it_should(cache: Path) -> None:
    fixed = ABORTS[3][2]
    np.testing.assert_array_equal(_run(cache, fixed)[:15], INPUT[1:60:4])


# Threads 32..63 read shared elements that only threads 0..31 were meant to write.
UNWRITTEN = {
    "static int array": (
        "  __shared__ __align__(16) int s[64];\n"
        "  if (threadIdx.x < 32) s[threadIdx.x] = (int)x[threadIdx.x];\n"
        "  __syncthreads();\n"
        "  y[threadIdx.x] = (float)s[threadIdx.x];"
    ),
    "extern float buffer": (
        "  extern __shared__ __align__(16) unsigned char sf_smem[];\n"
        "  float* const s = reinterpret_cast<float*>(sf_smem);\n"
        "  if (threadIdx.x < 32) s[threadIdx.x] = x[threadIdx.x];\n"
        "  __syncthreads();\n"
        "  y[threadIdx.x] = s[threadIdx.x];"
    ),
}


@pytest.mark.parametrize("body", list(UNWRITTEN.values()), ids=list(UNWRITTEN))
def test_read_of_unwritten_shared_memory_changes_with_the_fill(cache: Path, body: str) -> None:
    nan_fill, zero_fill = _run(cache, body, smem=256), _run(cache, body, fill=0x00, smem=256)
    assert not np.array_equal(nan_fill[32:], zero_fill[32:], equal_nan=True)
    np.testing.assert_array_equal(nan_fill[:32], zero_fill[:32])  # what was written reads the same
    fixed = body.replace("if (threadIdx.x < 32) ", "")
    np.testing.assert_array_equal(_run(cache, fixed, smem=256), _run(cache, fixed, fill=0x00, smem=256))
    np.testing.assert_array_equal(_run(cache, fixed, smem=256), INPUT)


@pytest.mark.parametrize("order", [1, 2], ids=["reversed", "reshuffled every round"])
def test_missing_barrier_shows_up_in_another_fiber_order(cache: Path, order: int) -> None:
    # Thread t reads what thread 63 - t wrote to shared memory, with no __syncthreads between.
    body = (
        "  __shared__ float s[64];\n"
        "  s[threadIdx.x] = x[threadIdx.x];\n"
        "  __syncwarp();\n"
        "  y[threadIdx.x] = s[63 - threadIdx.x];"
    )
    assert not np.array_equal(_run(cache, body), _run(cache, body, order=order), equal_nan=True)
    fixed = body.replace("__syncwarp();", "__syncthreads();")
    np.testing.assert_array_equal(_run(cache, fixed), _run(cache, fixed, order=order))
    np.testing.assert_array_equal(_run(cache, fixed), INPUT[::-1])
