"""Max and min reductions accumulate in the compute type, not double (`generator.accumulator`):
exact, so the results equal the reference bit for bit, NaN and infinities included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import DType, Graph, GraphBuilder, Op
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.generator import accumulator
from stitchfleet.compiler.targets.cpu.source import cluster_source


def row_extremes(shape: tuple[int, int], dtype: str) -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", shape, dtype)
    b.output("hi", b.reduce(Op.REDUCE_MAX, x * 2.0, (1,)))
    b.output("lo", b.reduce(Op.REDUCE_MIN, x, (1,)))
    b.output("sum", b.reduce_sum(x, (1,)))
    return b.build()


def test_only_sums_widen() -> None:
    assert accumulator(DType.F16, Op.REDUCE_MAX) is DType.F32
    assert accumulator(DType.F64, Op.REDUCE_MIN) is DType.F64
    assert accumulator(DType.F32, Op.REDUCE_SUM) is DType.F64
    assert accumulator(DType.I32, Op.REDUCE_MAX) is DType.I32
    graph = row_extremes((16, 64), "f32")
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    assert "sf_max_double(" not in text.split("struct f_tasks")[1] and "sf_max_float(lane" in text


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize("shape", [(16, 64), (5, 37), (3, 3000)])
def test_extremes_equal_the_reference_exactly(tmp_path: Path, dtype: str, shape: tuple[int, int]) -> None:
    graph = row_extremes(shape, dtype)
    executable = compile_cluster(graph, tmp_path)
    x = random_inputs(graph, 9)["x"].copy()
    x[0, -1] = np.nan  # NaN wins in its row, wherever it is
    x[1, :] = -np.inf
    x[2, shape[1] // 2] = np.inf
    got = executable({"x": x})
    want = evaluate(graph, {"x": x})
    for name in ("hi", "lo"):
        np.testing.assert_array_equal(got[name], want[name])
    assert np.isnan(got["hi"][0]) and np.isneginf(got["hi"][1]) and np.isposinf(got["hi"][2])
