"""Index-set splitting at concat boundaries (`cpu/pieces.py`): branch-free loops per piece."""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import DType, Graph, GraphBuilder
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.indexmath import simplify
from stitchfleet.compiler.targets.cpu.pieces import boundaries, pieces, shifted
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.tolerance import check_outputs

COL = k.Var("c", DType.I64)
Y = k.Var("y", DType.F32)


def gru_concat(rows: int = 16, width: int = 12) -> Graph:
    """[tanh(x + b), h, x * h] along the last axis: a GRU-style concat with a broadcast bias."""
    b = GraphBuilder()
    x, h, bias = b.parameter("x", (rows, width)), b.parameter("h", (rows, width)), b.parameter("b", (width,))
    gate = b.tanh(b.add(x, b.broadcast(bias, (rows, width), (1,))))
    b.output("cat", b.concat([gate, h, b.mul(x, h)], axis=1))
    return b.build()


def branch(edge: int, then: float, orelse: float) -> k.If:
    return k.If(
        k.lt(COL, k.i64(edge)), (k.Assign(Y, k.const(then, DType.F32)),), (k.Assign(Y, k.const(orelse, DType.F32)),)
    )


def test_boundaries_are_the_constants_the_column_is_compared_with() -> None:
    nested = k.If(k.lt(COL, k.i64(4)), (k.Assign(Y, k.const(1.0, DType.F32)),), (branch(9, 2.0, 3.0),))
    assert boundaries([nested], "c", {"c": 12}) == {4, 9}
    assert boundaries([k.Assign(Y, k.const(0.0, DType.F32))], "c", {"c": 12}) == set()


def test_each_piece_keeps_only_the_branch_it_takes() -> None:
    nested = k.If(k.lt(COL, k.i64(4)), (k.Assign(Y, k.const(1.0, DType.F32)),), (branch(9, 2.0, 3.0),))
    got = [
        (lo, hi, [s.value.value for s in body if isinstance(s, k.Assign)])
        for lo, hi, body in pieces([nested], "c", 12, {"c": 12})
    ]
    assert got == [(0, 4, [1.0]), (4, 9, [2.0]), (9, 12, [3.0])]


def test_a_piece_counting_from_zero_folds_its_offset_away() -> None:
    index = k.sub(COL, k.i64(72))  # what the lowering reads for the third piece of a concat
    assert simplify(shifted(index, "c", 72), {"c": 36}) == COL
    row = k.Var("r", DType.I64)
    bias = k.mod(k.add(k.mul(row, k.i64(36)), index), k.i64(36))
    assert simplify(shifted(bias, "c", 72), {"c": 36, "r": 8}) == COL  # the per-element modulo is gone


def test_a_concat_becomes_branch_free_loops_and_matches_the_reference(tmp_path: Path) -> None:
    graph = gru_concat()
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    body = text[text.index("struct f_tasks") :]
    assert "if (" not in body.split("return sf_bad")[0]  # no per-element branch left
    assert body.count("#pragma omp simd") >= 3
    inputs = random_inputs(graph, 11)
    got = compile_cluster(graph, tmp_path)(inputs)
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {n: v.reason for n, v in output_checks.items()}


def heads_to_rows(batch: int = 4, heads: int = 4, seq: int = 8, depth: int = 32) -> Graph:
    """The demo's attention output back to rows: [b, h, s, d] -> [b, s, h, d] -> [b*s, h*d], scaled."""
    b = GraphBuilder()
    x = b.parameter("x", (batch, heads, seq, depth))
    t = b.reshape(b.transpose(x, (0, 2, 1, 3)), (batch * seq, heads * depth))
    b.output("y", b.mul(t, 2.0))
    return b.build()


def test_a_transpose_gathers_whole_runs_without_per_element_division(tmp_path: Path) -> None:
    graph = heads_to_rows()
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    body = text[text.index("struct f_tasks") :]
    loop = body[body.index("_run = 0;") :]
    assert "_run < 4L" in loop and "< 32L" in loop  # four runs of one head's 32 values
    element = loop[loop.index("#pragma omp simd") : loop.index("sf_umax")]
    assert " / 32L" not in element and " % 32L" not in element
    inputs = random_inputs(graph, 5)
    got = compile_cluster(graph, tmp_path)(inputs)
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {n: v.reason for n, v in output_checks.items()}
