"""The fused non-finite flag, run on the CPU: the rendered kernels of a cluster note a NaN/Inf they store into
an op output in the module's `sf_nonfinite_flag` (no extra pass, no extra launch), in scalar and vector stores,
and leave it alone when every output is finite or when a non-finite value stays inside the cluster."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cuda.render import render_kernel
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuProgram
from stitchfleet.compiler.targets.cuda_cpu.module import CudaCpuOptions, load_module
from stitchfleet.compiler.targets.sim.interpreter import buffer_layout

pytestmark = pytest.mark.cuda_cpu


def _softmax_with_log(rows: int, cols: int) -> Graph:
    """A row softmax (reductions: scalar stores) and log(x) (element-wise: vector stores) as outputs."""
    b = GraphBuilder()
    x = b.parameter("x", (rows, cols))
    shifted = b.sub(x, b.reduce_max(x, (1,), keepdims=True))
    e = b.exp(shifted)
    b.output("softmax", b.div(e, b.reduce_sum(e, (1,), keepdims=True)))
    b.output("log", b.log(x))
    return b.build()


def _run(graph: Graph, x: np.ndarray, tmp_path: Path) -> tuple[int, dict[str, np.ndarray], list[str]]:
    lowered = lower(graph, plan_cluster(graph, 0, PlanOptions(device="tiny")))
    noted = frozenset(buffer for _, buffer in lowered.outputs)
    rendered = [render_kernel(k, noted) for k in lowered.kernels]
    options = CudaCpuOptions(tmp_path)
    library = load_module(rendered, options)
    flag = ctypes.c_int(0)
    ctypes.c_void_p.in_dll(library, "sf_nonfinite_flag").value = ctypes.addressof(flag)
    try:
        program = CudaCpuProgram([(r, library) for r in rendered], buffer_layout(lowered.kernels), options)
        ((_, source),) = lowered.inputs
        got = program({source: x})
    finally:
        ctypes.c_void_p.in_dll(library, "sf_nonfinite_flag").value = None
    by_output = {
        name: got[buffer].reshape(graph.node(node).shape)
        for (name, buffer), (_, node) in zip(lowered.outputs, graph.outputs, strict=True)
    }
    return flag.value, by_output, [r.source for r in rendered]


def test_finite_outputs_leave_the_flag_clear(tmp_path: Path) -> None:
    graph = _softmax_with_log(16, 64)
    x = np.random.default_rng(0).uniform(0.5, 2.0, (16, 64)).astype(np.float32)
    flag, got, sources = _run(graph, x, tmp_path)
    assert flag == 0
    want = evaluate(graph, {"x": x})
    np.testing.assert_allclose(got["log"], want["log"], rtol=1e-6)
    np.testing.assert_allclose(got["softmax"], want["softmax"], rtol=1e-5)
    assert all("sf_checked(" in source for source in sources)  # every kernel stores an output through it


@pytest.mark.parametrize("where", [(3, 0), (15, 63)])
def test_a_non_finite_output_sets_the_flag_in_the_kernel(where: tuple[int, int], tmp_path: Path) -> None:
    graph = _softmax_with_log(16, 64)
    x = np.random.default_rng(1).uniform(0.5, 2.0, (16, 64)).astype(np.float32)
    x[where] = 0.0  # log(0) = -inf in that one element; the softmax stays finite
    flag, got, _ = _run(graph, x, tmp_path)
    assert np.isneginf(got["log"][where]) and np.isfinite(got["softmax"]).all()
    assert flag == 1


def test_a_non_finite_value_inside_the_cluster_is_not_noted(tmp_path: Path) -> None:
    """exp overflows to inf inside, 1/inf stores 0: only what reaches an op output is noted."""
    b = GraphBuilder()
    x = b.parameter("x", (8, 32))
    b.output("y", b.div(1.0, b.exp(x)))
    graph = b.build()
    x = np.full((8, 32), 100.0, np.float32)  # exp(100) is inf in float32
    flag, got, sources = _run(graph, x, tmp_path)
    assert np.all(got["y"] == 0.0) and flag == 0
    assert any("sf_checked(" in source for source in sources)
