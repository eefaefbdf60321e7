"""Consecutive row-wise groups of a planned loop over the same rows in one column loop (`source._shared_runs`), and
a fused element-wise set over the same elements in it too (`source._host`): a value several of them compute is
computed once an element, an input they read is read in one pass; results equal the reference."""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.tolerance import check_outputs


def residual_layernorm(rows: int = 64, cols: int = 128) -> Graph:
    """x + dropout(y), normalised over its rows: the normalised row and its scaled and shifted form, both outputs."""
    b = GraphBuilder()
    x, y, u = b.parameter("x", (rows, cols)), b.parameter("y", (rows, cols)), b.parameter("u", (rows, cols))
    w, s = b.parameter("w", (cols,)), b.parameter("s", (cols,))
    h = x + b.select(b.binary(Op.GREATER_EQUAL, u, 0.1), y * 1.1, b.binary(Op.MUL, y, 0.0))
    row = (rows, cols)
    centred = h - b.broadcast_to(b.reduce_mean(h, (1,), keepdims=True), row)
    var = b.reduce_mean(centred * centred, (1,), keepdims=True)
    normal = centred * b.broadcast_to(b.rsqrt(var + 0.001), row)
    b.output("normal", normal)
    b.output("out", normal * b.broadcast_to(w, row) + b.broadcast_to(s, row))
    return b.build()


def test_row_wise_groups_of_one_loop_share_their_column_loop(tmp_path: Path) -> None:
    """Regression: each row-wise group had its own column loop, and gcc recomputed the normalised row's chain
    in each (the transformer's dropout + residual + layer norm: 53.8 -> 51.3 us through _pooled, one thread)."""
    graph = residual_layernorm()
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    last = text[text.rindex("static void f_part") :]
    assert last.count("output, rowwise") == 1 and "/* groups 2, 3: output, rowwise */" in last
    shared = last[last.index("output, rowwise") :]
    assert shared.count("rowc_") == 1  # the row's cached values loaded once an element for both outputs
    inputs = random_inputs(graph, 7)
    got = compile_cluster(graph, tmp_path)(inputs)
    checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in checks.values()), {n: v.reason for n, v in checks.items()}


def softmax_with_mask(rows: int = 256, cols: int = 32) -> Graph:
    """An attention softmax, its dropout mask as an output of its own (a fused element-wise set) and the dropout."""
    b = GraphBuilder()
    x, u = b.parameter("x", (rows, cols)), b.parameter("u", (rows, cols))
    row = (rows, cols)
    e = b.exp(x - b.broadcast_to(b.reduce_max(x, (1,), keepdims=True), row))
    p = e / b.broadcast_to(b.reduce_sum(e, (1,), keepdims=True), row)
    keep = b.binary(Op.GREATER_EQUAL, u, 0.1)
    b.output("p", p)
    b.output("keep", keep)
    b.output("drop", b.select(keep, p * 1.1, b.binary(Op.MUL, p, 0.0)))
    return b.build()


def test_a_fused_set_over_the_same_rows_runs_in_the_planned_loop(tmp_path: Path) -> None:
    """Regression: the mask was a part of its own, a pass over `u` before the softmax's loop read it again
    (the transformer's attention softmax + dropout with cold caches: 90.1 -> 81.2 us through _pooled, one thread)."""
    graph = softmax_with_mask()
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    assert text.count("    sf_run(sf_pool, ") == 1
    inputs = random_inputs(graph, 8)
    got = compile_cluster(graph, tmp_path)(inputs)
    checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in checks.values()), {n: v.reason for n, v in checks.items()}
