"""cuda-cpu contracts a*b+c into one FMA by default, as NVRTC does (--fmad=true), and says what it cannot.

The kernel `y = x * x - 1` on x = 1 + 2^-12 gives 2^-11 when the product is rounded first and
2^-11 + 2^-24 when it is fused: the default build must give the fused value (what NVRTC's PTX
computes: its `fma.rn.f32`, checked when libnvrtc is there), the `fma=False` build the rounded one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import Buffer, Launch, Role
from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuOptions, CudaCpuProgram
from stitchfleet.compiler.targets.cuda_cpu.module import load_kernel

pytestmark = pytest.mark.cuda_cpu

X = Buffer("x", DType.F32, 32, Role.INPUT)
Y = Buffer("y", DType.F32, 32, Role.OUTPUT)
SOURCE = (
    'extern "C" __global__ void k(const float* x, float* y) {\n'
    "  y[threadIdx.x] = x[threadIdx.x] * x[threadIdx.x] - 1.0f;\n}\n"
)
VALUE = np.float32(1 + 2.0**-12)
ROUNDED, FUSED = np.float32(2.0**-11), np.float32(2.0**-11 + 2.0**-24)


def _run(tmp_path: Path, **options: Any) -> npt.NDArray[Any]:
    kernel = CudaKernel("k", SOURCE, (X, Y), Launch(1, 32, 1), False, 0, 0)
    built = CudaCpuOptions(tmp_path, **options)
    program = CudaCpuProgram([(kernel, load_kernel(kernel, built))], {"x": X, "y": Y}, built)
    result: npt.NDArray[Any] = program({"x": np.full(32, VALUE)})["y"]
    return result


def test_the_default_build_contracts_as_nvrtc_does(tmp_path: Path) -> None:
    assert ROUNDED != FUSED
    np.testing.assert_array_equal(_run(tmp_path), np.full(32, FUSED))
    np.testing.assert_array_equal(_run(tmp_path, debug=True), np.full(32, FUSED))


def test_fma_false_builds_without_contraction(tmp_path: Path) -> None:
    np.testing.assert_array_equal(_run(tmp_path, fma=False), np.full(32, ROUNDED))


def test_nvrtc_fuses_the_same_expression() -> None:
    nvrtc = find_nvrtc()
    if nvrtc is None:
        pytest.skip("no libnvrtc: install the dev extra (nvidia-cuda-nvrtc-cu12)")
    ptx = nvrtc.compile(SOURCE, "sm_90", target="ptx").decode()
    assert re.search(r"\bfma\.rn\.f32\b", ptx)
    assert not re.search(r"\bmul(\.rn)?\.f32\b", ptx)
