"""cuda-cpu runs the renderer's CUDA text on the CPU: suite clusters match evaluate (tolerance rule).

The default tier runs a fast slice (bf16 atomics, a grid barrier on the `tiny` profile, warp
and block reductions); the whole suite sweep on `tiny` is marked slow. Shared objects are
cached by hash of their source under a per-session directory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.suite import CASES, build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.runtime.sim import run as run_sim
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend
from stitchfleet.compiler.tolerance import check_outputs
from tests.compiler.test_stitch_sim import SMALL

pytestmark = pytest.mark.cuda_cpu

FAST = (("softmax_fwd", "bf16"), ("few_long_rows", "f32"), ("layernorm_bwd", "f32"), ("gelu_bwd_bias_grad", "bf16"))


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory) -> CudaCpuBackend:
    # The header's debug checks and -fsanitize=alignment on, as the issue asks of the tier.
    return CudaCpuBackend(Path(tmp_path_factory.mktemp("cuda-cpu-cache")), debug=True)


def _check_cluster(backend: CudaCpuBackend, graph: Graph, profile: str) -> tuple[int, int]:
    """Runs one cluster on cuda-cpu; asserts the tolerance rule; returns (outputs, bit-equal with sim)."""
    lowered = lower(graph, plan_cluster(graph, 0, PlanOptions(device=profile)))
    inputs = random_inputs(graph, 0)
    buffers = {buf: np.asarray(inputs[n]).reshape(-1) for n, buf in lowered.inputs}
    raw = backend.compile(lowered.kernels)(buffers)
    sim = run_sim(lowered.kernels, buffers)
    shapes = {n: graph.node(nid).shape for n, nid in graph.outputs}
    got = {n: raw[buf].reshape(shapes[n]) for n, buf in lowered.outputs}
    verdicts = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    bad = {name: v.reason for name, v in verdicts.items() if not v.ok}
    assert not bad, f"{graph.metadata.get('case', '')}: {bad}"
    equal = sum(int(np.array_equal(raw[buf], sim[buf], equal_nan=True)) for _, buf in lowered.outputs)
    return len(lowered.outputs), equal


def _clusters(name: str, dtype: str) -> list[Graph]:
    graph = build_case(name, SMALL[name], dtype)
    return [extract(graph, c.nodes) for c in find_clusters(graph, 8).clusters]


def test_every_suite_case_has_a_small_shape() -> None:
    assert set(SMALL) == set(CASES)


@pytest.mark.parametrize(("name", "dtype"), FAST)
def test_fast_slice_on_cuda_cpu(backend: CudaCpuBackend, name: str, dtype: str) -> None:
    for graph in _clusters(name, dtype):
        outputs, _ = _check_cluster(backend, graph, "tiny")
        assert outputs >= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_suite_case_and_dtype_on_cuda_cpu(backend: CudaCpuBackend, name: str) -> None:
    for dtype in CASES[name].dtypes:
        for graph in _clusters(name, dtype):
            _check_cluster(backend, graph, "tiny")


def test_reversed_fiber_order_gives_the_same_bits(tmp_path: Path) -> None:
    # A second legal order of the threads within each block: a missing barrier would differ.
    graph = _clusters("softmax_fwd", CASES["softmax_fwd"].dtypes[0])[0]  # no cross-block atomics: deterministic
    lowered = lower(graph, plan_cluster(graph, 0, PlanOptions(device="tiny")))
    inputs = random_inputs(graph, 0)
    buffers = {buf: np.asarray(inputs[n]).reshape(-1) for n, buf in lowered.inputs}
    forward = CudaCpuBackend(tmp_path, debug=True).compile(lowered.kernels)(buffers)
    backward = CudaCpuBackend(tmp_path, debug=True, order=1).compile(lowered.kernels)(buffers)
    for _, buf in lowered.outputs:
        np.testing.assert_array_equal(forward[buf], backward[buf])
