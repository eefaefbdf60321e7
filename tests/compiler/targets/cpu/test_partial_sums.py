"""Float sums add blocks in float partials folded into double accumulators (`generator.PART_CHUNKS`,
`PART_ROWS`): the generated C has them where the values are float and only there, and long rows and
columns stay at least as close to float64 as numpy's float32 sums."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler.ir import DType, Graph, GraphBuilder, Op
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.generator import partial
from stitchfleet.compiler.targets.cpu.source import cluster_source


def sums(shape: tuple[int, int], dtype: str = "f32") -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", shape, dtype)
    b.output("rows", b.reduce_sum(x, (1,)))
    b.output("cols", b.reduce_sum(x, (0,)))
    return b.build()


def test_only_float_sums_take_partials() -> None:
    assert partial(DType.F32, Op.REDUCE_SUM) is DType.F32 and partial(DType.F16, Op.REDUCE_MEAN) is DType.F32
    assert partial(DType.F64, Op.REDUCE_SUM) is None and partial(DType.F32, Op.REDUCE_PROD) is None
    assert partial(DType.F32, Op.REDUCE_MAX) is None and partial(DType.I32, Op.REDUCE_SUM) is None
    for dtype, expected in (("f32", True), ("f64", False)):
        graph = sums((64, 256), dtype)
        text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
        assert (" part_" in text and " parts_" in text) is expected


@pytest.mark.parametrize("shape", [(3, 30000), (4000, 48), (6, 200), (5, 7)])
def test_long_sums_are_as_close_to_float64_as_numpy(tmp_path: Path, shape: tuple[int, int]) -> None:
    """Errors in units of the summed magnitudes (sum |x|): what a summation order controls; a result's
    own relative error also depends on how much its terms cancel."""
    graph = sums(shape)
    data = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    got = compile_cluster(graph, tmp_path)({"x": data})
    wide, size = data.astype(np.float64), np.abs(data.astype(np.float64))
    for name, axis in (("rows", 1), ("cols", 0)):
        exact, scale = wide.sum(axis=axis), size.sum(axis=axis)
        mine = np.max(np.abs(got[name] - exact) / scale)
        numpy_error = np.max(np.abs(data.sum(axis=axis) - exact) / scale)
        # one float32 rounding of the result is the least any float32 output has
        assert mine <= max(numpy_error, 2.0**-24), (name, mine, numpy_error)
