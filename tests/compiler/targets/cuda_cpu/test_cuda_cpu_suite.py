"""cuda-cpu runs the renderer's CUDA text on the CPU: suite clusters match evaluate (tolerance rule).

The default tier runs a fast slice (bf16 atomics, a grid barrier on the `tiny` profile, warp
and block reductions); the whole suite (every case x dtype on `tiny`, 23 clusters in one
g++ unit) is marked slow. Both in the checked build, each cluster rerun with a 0x00 shared
fill and, without atomics, with fibers and blocks in other orders (sweep.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.suite import CASES, build_case
from stitchfleet.compiler.plan import PlanOptions
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend
from tests.compiler.targets.cuda_cpu.sweep import Case, buffers_of, clusters, problems, run_cases, suite_cases
from tests.compiler.test_stitch_sim import SMALL

pytestmark = pytest.mark.cuda_cpu

FAST = (("softmax_fwd", "bf16"), ("few_long_rows", "f32"), ("layernorm_bwd", "f32"), ("gelu_bwd_bias_grad", "bf16"))


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> CudaCpuBackend:
    # The header's debug checks and -fsanitize=alignment on, as the issue asks of the tier.
    return CudaCpuBackend(Path(tmp_path_factory.mktemp("cuda-cpu-cache")), debug=True)


def test_every_suite_case_has_a_small_shape() -> None:
    assert set(SMALL) == set(CASES)


def test_fast_slice_on_cuda_cpu(backend: CudaCpuBackend) -> None:
    cases = [
        Case(f"{name} {dtype} #{i}", graph, PlanOptions(device="tiny"))
        for name, dtype in FAST
        for i, graph in enumerate(clusters(build_case(name, SMALL[name], dtype)))
    ]
    assert len(cases) >= len(FAST)
    outcomes = run_cases(backend, cases)
    assert not problems(outcomes)
    assert all(o.outputs >= 1 for o in outcomes)


@pytest.mark.slow
def test_every_suite_case_and_dtype_on_cuda_cpu(backend: CudaCpuBackend) -> None:
    cases = suite_cases()
    assert len(cases) >= sum(len(CASES[name].dtypes) for name in SMALL)  # one cluster or more each
    assert not problems(run_cases(backend, cases))


def test_reversed_fiber_order_gives_the_same_bits(tmp_path: Path) -> None:
    # A second legal order of the threads within each block: a missing barrier would differ
    # (softmax has no cross-block atomics, so free-running blocks are deterministic too).
    graph = clusters(build_case("softmax_fwd", SMALL["softmax_fwd"], CASES["softmax_fwd"].dtypes[0]))[0]
    case = Case("softmax_fwd", graph, PlanOptions(device="tiny"))
    lowered = case.lowered()
    buffers = buffers_of(case, lowered)
    forward = CudaCpuBackend(tmp_path, debug=True).compile(lowered.kernels)(buffers)
    backward = CudaCpuBackend(tmp_path, debug=True, order=1).compile(lowered.kernels)(buffers)
    for _, buf in lowered.outputs:
        np.testing.assert_array_equal(forward[buf], backward[buf])
