"""Row caches (`cpu.rowcache`): a row reduction's operand computed once per task and read back by the
task's later groups, only where they read it at their own element; results equal the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.rowcache import in_place
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.tolerance import check_outputs


def softmax_dropout(rows: int, cols: int, dtype: str = "f32") -> Graph:
    """The demo's attention softmax: scaled scores, row max, exp, row sum, probabilities and dropout."""
    b = GraphBuilder()
    x, u = b.parameter("x", (rows, cols), dtype), b.parameter("u", (rows, cols), dtype)
    scores = x * 0.125
    top = b.broadcast_to(b.reduce_max(scores, (1,), keepdims=True), (rows, cols))
    e = b.exp(scores - top)
    p = e / b.broadcast_to(b.reduce_sum(e, (1,), keepdims=True), (rows, cols))
    b.output("p", p)
    b.output("drop", b.select(b.binary(Op.GREATER_EQUAL, u, 0.1), p * 1.1, b.binary(Op.MUL, p, 0.0)))
    return b.build()


def body(graph: Graph) -> str:
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    return text[text.index("struct f_tasks") :]


def test_the_exp_of_a_softmax_is_computed_once_per_element() -> None:
    text = body(softmax_dropout(64, 32))
    assert "rowc_" in text
    assert text.count("sf_expf(") == 2  # the sum's vector chunk and its tail loop, nothing after


@pytest.mark.parametrize(("rows", "cols", "dtype"), [(64, 32, "f32"), (37, 33, "f32"), (9, 200, "f16"), (5, 7, "f32")])
def test_cached_rows_match_the_reference(tmp_path: Path, rows: int, cols: int, dtype: str) -> None:
    graph = softmax_dropout(rows, cols, dtype)
    inputs = random_inputs(graph, 3)
    inputs["x"] = inputs["x"].copy()
    inputs["x"][-1, -1] = np.inf  # the last element of the last row: NaN through inf - inf, flagged
    executable = compile_cluster(graph, tmp_path)
    got = executable(inputs)
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {n: v.reason for n, v in output_checks.items()}
    assert executable.run([inputs[n] for n in executable.input_names])[1]


def test_only_element_wise_paths_of_the_same_shape_read_in_place() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (8, 8))
    e = b.exp(x)
    row = b.reduce_sum(e, (1,), keepdims=True)
    same = e * 2.0 + 1.0
    moved = b.transpose(e, (1, 0)) * 2.0
    via_row = b.broadcast_to(row, (8, 8)) - e
    b.output("a", same)
    b.output("b", moved)
    b.output("c", via_row)
    graph = b.build()
    assert in_place(graph, same.id, e.id)
    assert not in_place(graph, moved.id, e.id)  # read at the transposed element
    assert not in_place(graph, via_row.id, e.id)  # the row sum recomputed from e would need every element
    assert in_place(graph, via_row.id, e.id, loaded={row.id})  # unless the row sum is read from its buffer
    assert in_place(graph, x.id, e.id)  # no path at all


def test_no_cache_is_kept_for_a_value_later_groups_only_reach_through_the_reduction() -> None:
    """Softmax backward: the sum of dy * y is read from its buffer; dx recomputes dy and y, not dy * y."""
    text = body(build_case("softmax_bwd", (64, 32), "f32"))
    assert "rowc_" not in text


def test_a_light_value_read_by_one_group_is_recomputed_not_cached() -> None:
    b = GraphBuilder()
    x, y = b.parameter("x", (48, 64)), b.parameter("y", (48, 64))
    v = x * 1.5 + y
    b.output("centred", v - b.broadcast_to(b.reduce_sum(v, (1,), keepdims=True), (48, 64)))
    graph = b.build()
    assert "rowc_" not in body(graph)


def layernorm_backward_rows(rows: int = 64, cols: int = 128) -> Graph:
    """A layer norm backward as TF's graph has it: the row sums over a `(1, rows, cols, 1)` reshape of a light chain
    that the output reads again, un-reshaped (the transformer's cluster 9)."""
    b = GraphBuilder()
    x, g, w = b.parameter("x", (rows, cols)), b.parameter("g", (rows, cols)), b.parameter("w", (cols,))
    dy = g * b.broadcast_to(w, (rows, cols)) * 2.0
    four = (1, rows, cols, 1)
    s1 = b.reduce_sum(b.reshape(dy, four), (0, 2, 3))
    s2 = b.reduce_sum(b.reshape(dy, four) * b.reshape(x, four), (0, 2, 3))
    row = (rows, cols)
    b.output(
        "dx", dy - b.broadcast_to(b.reshape(s1, (rows, 1)), row) - x * b.broadcast_to(b.reshape(s2, (rows, 1)), row)
    )
    return b.build()


def test_a_reshaped_operand_is_cached_for_the_groups_that_read_it_unreshaped(tmp_path: Path) -> None:
    """Regression: an operand reached through a reshape to `(1, rows, cols, 1)` was neither cached (a reshape is no
    element-wise op, and its last dimension is 1) nor read in place, so each of the task's three groups recomputed
    the row's chain (the transformer's layer-norm backward, one thread: 193.9 -> 175.6 us a call)."""
    graph = layernorm_backward_rows()
    assert "rowc_" in body(graph)
    inputs = random_inputs(graph, 4)
    got = compile_cluster(graph, tmp_path)(inputs)
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {n: v.reason for n, v in output_checks.items()}
