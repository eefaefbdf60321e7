"""Building-block kernels run as rendered CUDA on the CPU and agree with the sim.

The kernels the nvcc/NVRTC tests only compile (tests/compiler/targets/cuda/suite_kernels.py):
a grid reduction through a grid barrier, atomics of every kind on every dtype (2-byte
compare-and-swap loops included), the 16-byte vector loop; and shared arena views that
overlap by liveness, static and carved from dynamic shared memory. Order-independent
results (max, min, integer sums, plain stores) must equal the sim's bits; float sums by
atomics run in OS-thread order, so they get the tolerance rule's native allowance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend
from stitchfleet.compiler.targets.sim.interpreter import run as run_sim
from tests.compiler.targets.cuda.suite_kernels import block_kernels, scale_kernel
from tests.compiler.targets.cuda.test_cuda_arena import OWN, A, B, arena_kernel

pytestmark = pytest.mark.cuda_cpu


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> CudaCpuBackend:
    return CudaCpuBackend(Path(tmp_path_factory.mktemp("cuda-cpu-blocks")), debug=True)


def _inputs(kernel: ir.Kernel) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    out: dict[str, Any] = {}
    for buf in kernel.params:
        if buf.role is ir.Role.INPUT:
            floating = buf.dtype in (DType.F16, DType.BF16, DType.F32, DType.F64)
            values = rng.normal(size=buf.size) if floating else rng.integers(-50, 50, buf.size)
            out[buf.name] = values.astype(np.float32 if buf.dtype is DType.BF16 else buf.dtype.numpy)
    return out


def _order_dependent(kernel: ir.Kernel) -> bool:
    return "atomic_add" in kernel.name and kernel.name.split("_")[-1] in ("f16", "bf16", "f32", "f64")


def test_block_kernels_agree_with_the_sim(backend: CudaCpuBackend) -> None:
    kernels = [*block_kernels(), scale_kernel()]
    programs = backend.compile_many([[k] for k in kernels])
    exact = 0
    for kernel, program in zip(kernels, programs, strict=True):
        inputs = _inputs(kernel)
        got, ref = program(inputs), run_sim([kernel], inputs)
        for name, value in ref.items():
            if _order_dependent(kernel):
                # n additions in another order: a few units in the last place of the running sum per add
                scale = np.abs(inputs["src"]).sum()
                tolerance = 1e-2 if kernel.name.endswith(("f16", "bf16")) else 1e-5
                assert abs(float(got[name][0]) - float(value[0])) <= tolerance * scale, kernel.name
            else:
                np.testing.assert_array_equal(got[name], value, err_msg=kernel.name)
                exact += 1
    assert exact >= len(kernels) - 4  # everything but the four float atomic sums is compared bit for bit


@pytest.mark.parametrize("dynamic", [False, True], ids=["static arena", "arena in dynamic shared memory"])
def test_overlapping_arena_views_agree_with_the_sim(backend: CudaCpuBackend, dynamic: bool) -> None:
    launch = ir.Launch(1, 128, 1, dynamic_smem_bytes=64, shared_limit_bytes=96 * 1024) if dynamic else None
    kernel = arena_kernel((A, B, OWN), launch)
    inputs = {"x": np.random.default_rng(3).normal(size=128).astype(np.float32)}
    got, ref = backend.compile([kernel])(inputs), run_sim([kernel], inputs)
    assert set(got) == {"y"} and got["y"].dtype == np.float64
    np.testing.assert_array_equal(got["y"], ref["y"])


def test_a_kernel_past_48_kib_of_shared_memory_runs_from_dynamic_shared_memory(backend: CudaCpuBackend) -> None:
    from stitchfleet.compiler.targets.cuda.render import render_kernel
    from tests.compiler.targets.cuda.suite_kernels import LARGE_TILE, large_smem_kernel

    kernel = large_smem_kernel()
    rendered = render_kernel(kernel)
    assert rendered.dynamic_smem_bytes == LARGE_TILE * 4 > 48 * 1024  # the launch's opt-in size
    assert "extern __shared__" in rendered.source
    x = np.arange(2 * LARGE_TILE, dtype=np.float32)
    (got,) = backend.compile([kernel])({"x": x}).values()
    np.testing.assert_array_equal(got, x.reshape(2, LARGE_TILE)[:, ::-1].reshape(-1))
