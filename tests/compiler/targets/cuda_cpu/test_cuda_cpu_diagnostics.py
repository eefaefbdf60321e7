"""cuda-cpu's debug checks fire on deliberately broken hand-written CUDA kernels.

Each kernel is one tiny `extern "C" __global__` text launched with the backend's contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import Buffer, Launch, Role
from stitchfleet.compiler.render.cuda import CudaKernel
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuError, CudaCpuOptions, CudaCpuProgram
from stitchfleet.compiler.targets.cuda_cpu.module import load_kernel

pytestmark = pytest.mark.cuda_cpu

X = Buffer("x", DType.F32, 64, Role.INPUT)
Y = Buffer("y", DType.F32, 64, Role.OUTPUT)


def _run(tmp_path: Path, body: str, *, order: int = 0, debug: bool = True) -> npt.NDArray[Any]:
    source = f'extern "C" __global__ void k(const float* x, float* y) {{\n{body}\n}}\n'
    kernel = CudaKernel("k", source, (X, Y), Launch(1, 64, 1), False, 0, 0)
    options = CudaCpuOptions(tmp_path, debug=debug, order=order)
    program = CudaCpuProgram([(kernel, load_kernel(kernel, options))], {"x": X, "y": Y}, options)
    result: npt.NDArray[Any] = program({"x": np.arange(64, dtype=np.float32)})["y"]
    return result


def test_a_correct_kernel_runs(tmp_path: Path) -> None:
    body = "  y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1, 32);"
    got = _run(tmp_path, body)
    np.testing.assert_array_equal(got, np.arange(64, dtype=np.float32).reshape(-1, 2)[:, ::-1].reshape(-1))


def test_barrier_reached_by_part_of_a_block(tmp_path: Path) -> None:
    body = "  if (threadIdx.x < 10) return;\n  __syncthreads();\n  y[threadIdx.x] = x[threadIdx.x];"
    with pytest.raises(CudaCpuError, match="part of a block"):
        _run(tmp_path, body)


def test_mask_naming_an_exited_lane(tmp_path: Path) -> None:
    body = "  if (threadIdx.x == 3) return;\n  y[threadIdx.x] = __shfl_sync(0xffffffffu, x[threadIdx.x], 0, 32);"
    with pytest.raises(CudaCpuError, match="exited"):
        _run(tmp_path, body)


def test_shuffle_reading_a_lane_outside_its_mask(tmp_path: Path) -> None:
    body = "  if (threadIdx.x < 16) y[threadIdx.x] = __shfl_sync(0x0000ffffu, x[threadIdx.x], 20, 32);"
    with pytest.raises(CudaCpuError, match="outside its mask"):
        _run(tmp_path, body)


def test_missing_barrier_shows_up_in_the_reversed_order(tmp_path: Path) -> None:
    # Thread t reads what thread 63 - t wrote to shared memory, with no __syncthreads between.
    body = (
        "  __shared__ float s[64];\n"
        "  s[threadIdx.x] = x[threadIdx.x];\n"
        "  __syncwarp();\n"
        "  y[threadIdx.x] = s[63 - threadIdx.x];"
    )
    forward, backward = _run(tmp_path, body), _run(tmp_path, body, order=1)
    assert not np.array_equal(forward, backward)
    fixed = body.replace("__syncwarp();", "__syncthreads();")
    np.testing.assert_array_equal(_run(tmp_path, fixed), _run(tmp_path, fixed, order=1))
