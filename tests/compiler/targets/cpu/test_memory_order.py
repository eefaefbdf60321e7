"""Strided reductions read in memory order (`source._memory_order`): same values, same summation order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op
from stitchfleet.compiler.plan import MappingKind, PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.tolerance import check_outputs

CASES = {  # operand shape, reduced axes, reduction
    "middle": ((8, 4, 32, 32), (1, 2), Op.REDUCE_SUM),
    "interleaved": ((3, 5, 6, 7, 4), (1, 3), Op.REDUCE_MEAN),
    "leading": ((40, 3, 24), (0,), Op.REDUCE_MAX),
    "two_kept": ((6, 10, 16), (1,), Op.REDUCE_SUM),
}


def strided(shape: tuple[int, ...], axes: tuple[int, ...], op: Op) -> Graph:
    """mask ? x * 1.1 - broadcast(b) : 0, reduced: a producer chain with broadcast index math."""
    b = GraphBuilder()
    x, m = b.parameter("x", shape), b.parameter("m", shape, "bool")
    small = b.parameter("b", shape[:-1])
    wide = b.broadcast(small, shape, tuple(range(len(shape) - 1)))
    value = b.select(m, x * 1.1 - wide, b.binary(Op.MUL, x, 0.0))
    b.output("r", b.reduce(op, value, axes))
    return b.build()


@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_order_matches_the_reference(tmp_path: Path, case: str) -> None:
    graph = strided(*CASES[case])
    plan = plan_cluster(graph, 0, PlanOptions())
    inputs = random_inputs(graph, 7)
    got = compile_cluster(graph, tmp_path, plan)(inputs)
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {n: v.reason for n, v in output_checks.items()}


def test_the_demo_shape_takes_the_memory_order_path() -> None:
    graph = strided(*CASES["middle"])
    plan = plan_cluster(graph, 0, PlanOptions())
    assert any(g.mapping.kind is MappingKind.THREAD_PER_OUTPUT for g in plan.groups)
    text = cluster_source(graph, plan).text
    assert "#pragma omp simd" in text and " / 32L" not in text and " % 32L" not in text


def test_sum_equals_a_float64_fold_in_order(tmp_path: Path) -> None:
    """Double accumulation in increasing reduced index, rounded once: equal to numpy's float64 sum."""
    b = GraphBuilder()
    x = b.parameter("x", (5, 64, 9))
    b.output("s", b.reduce_sum(x, (1,)))
    graph = b.build()
    data = np.random.default_rng(3).standard_normal((5, 64, 9)).astype(np.float32)
    got = compile_cluster(graph, tmp_path)({"x": data})["s"]
    want = np.add.reduce(data.astype(np.float64), axis=1).astype(np.float32)
    np.testing.assert_array_equal(got, want)
