"""cuda-cpu's block and warp votes (`__syncthreads_or/and/count`, `__any_sync`, `__all_sync`) give what CUDA
defines, in every legal fiber order, and a launch wider than the kernel's `__launch_bounds__` is refused as
NVRTC's kernel would be."""

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
from stitchfleet.compiler.targets.cuda_cpu.module import launch_bounds, load_kernel

pytestmark = pytest.mark.cuda_cpu

X = Buffer("x", DType.F32, 64, Role.INPUT)
Y = Buffer("y", DType.F32, 64, Role.OUTPUT)
INPUT = np.arange(64, dtype=np.float32)


def _run(tmp_path: Path, body: str, *, order: int = 0, bounds: str = "", block: int = 64) -> npt.NDArray[Any]:
    source = f'extern "C" __global__ void {bounds} k(const float* x, float* y) {{\n{body}\n}}\n'
    kernel = CudaKernel("k", source, (X, Y), Launch(1, block, 1), False, 0, 0)
    options = CudaCpuOptions(tmp_path, debug=True, order=order)
    program = CudaCpuProgram([(kernel, load_kernel(kernel, options))], {"x": X, "y": Y}, options)
    result: npt.NDArray[Any] = program({"x": INPUT})["y"]
    return result


VOTES = (
    "  int t = threadIdx.x;\n"
    "  int a = __syncthreads_or(t == 17);\n"  # one thread: true
    "  int b = __syncthreads_and(t < 63);\n"  # all but one: false
    "  int c = __syncthreads_count(t % 3 == 0);\n"  # 22 of 64
    "  int d = __syncthreads_or(0);\n"  # the same barrier again, nobody true: the count starts afresh
    "  int e = __any_sync(0xffffffffu, t == 40);\n"  # true in warp 1 only
    "  int f = __all_sync(0xffffffffu, t != 5);\n"  # false in warp 0 only
    "  y[t] = a + 2 * b + 4 * c + 1000 * d + 10000 * e + 100000 * f;"
)


@pytest.mark.parametrize("order", [0, 1, 2])
def test_block_and_warp_votes(tmp_path: Path, order: int) -> None:
    got = _run(tmp_path, VOTES, order=order)
    lane = np.arange(64)
    want = 1 + 4 * 22 + 10000 * (lane >= 32) + 100000 * (lane >= 32)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_launch_bounds_are_read_from_the_text() -> None:
    text = 'extern "C" __global__ void __launch_bounds__(256, 2) a(int* x) {}\nextern "C" __global__ void b() {}'
    assert launch_bounds(text) == {"a": 256, "b": 1024}


def test_a_launch_wider_than_its_bounds_is_refused(tmp_path: Path) -> None:
    body = "  if (threadIdx.x < 64) y[threadIdx.x] = x[threadIdx.x];"
    np.testing.assert_array_equal(_run(tmp_path, body, bounds="__launch_bounds__(64)"), INPUT)
    with pytest.raises(CudaCpuError, match=r"launch of 128 threads exceeds __launch_bounds__\(64\)"):
        _run(tmp_path, body, bounds="__launch_bounds__(64)", block=128)
