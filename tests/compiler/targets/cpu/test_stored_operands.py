"""A value an earlier part wrote whole as an output is loaded (`Gen.stored`) instead of recomputed from its
producers: by a reduction whose operand it is (the GELU backward's bias gradient reads `dx`, not dy, x, bias,
erf and exp) and by a later row-wise group that reads it in place (`rowcache.load_stored`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.suite import build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.compiler.plan import MappingKind, PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.tolerance import check_outputs


def reduction_part(text: str) -> str:
    """The part function holding the column reduction."""
    parts = text.split("static void f_part")[1:]
    return next(p for p in parts if "column_tiles" in p)


def test_the_bias_gradient_loads_dx() -> None:
    graph = build_case("gelu_bwd_bias_grad", (64, 256), "f32")
    part = reduction_part(cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text)
    assert "out0_dx[" in part and "sf_erff" not in part and "sf_expf" not in part


def test_a_rounded_output_is_recomputed() -> None:
    """An f16 output holds the value rounded to f16 (the reduction adds it in float): recomputed."""
    graph = build_case("gelu_bwd_bias_grad", (64, 256), "f16")
    part = reduction_part(cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text)
    assert "sf_erff" in part


def test_the_loaded_sum_equals_the_recomputed_one(tmp_path: Path) -> None:
    """The output holds the bits the reduction computed before, so dbias is the column sum of the kernel's own
    dx, bit for bit: the same as a cluster that only sums dx given as its input (the same plan for the sum)."""
    graph = build_case("gelu_bwd_bias_grad", (64, 256), "f32")
    got = compile_cluster(graph, tmp_path)(random_inputs(graph, 4))
    b = GraphBuilder()
    b.output("s", b.reduce_sum(b.parameter("dx", (64, 256)), (0,)))
    sums = b.build()
    np.testing.assert_array_equal(got["dbias"], compile_cluster(sums, tmp_path)({"dx": got["dx"]})["s"])


def centered() -> Graph:
    """y = a * w + a (an output), its column sum, and y less its row mean (a row-wise group after a reduction)."""
    b = GraphBuilder()
    a, w = b.parameter("a", (64, 256)), b.parameter("w", (64, 256))
    y = a * w + a
    b.output("y", y)
    b.output("s", b.reduce_sum(y, (0,)))
    b.output("z", y - b.reduce_mean(y, (1,), keepdims=True))
    return b.build()


def test_later_parts_read_y_not_its_inputs(tmp_path: Path) -> None:
    graph = centered()
    parts = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text.split("static void f_part")[1:]
    later = [p for p in parts[1:] if "group" in p]
    assert len(later) == 2 and all("out0_y[" in p and "in1_w[" not in p for p in later)
    inputs = random_inputs(graph, 2)
    checks = check_outputs(
        compile_cluster(graph, tmp_path)(inputs), evaluate(graph, inputs), evaluate(graph, inputs, "float64")
    )
    assert all(v.ok for v in checks.values()), {n: v.reason for n, v in checks.items()}


def normalised_bias_grad(rows: int = 64, cols: int = 128) -> Graph:
    """z = (x - row mean) * w (an output of a row-reducing loop), and its column sum (a later stage)."""
    b = GraphBuilder()
    x, w = b.parameter("x", (rows, cols)), b.parameter("w", (cols,))
    z = (x - b.broadcast_to(b.reduce_mean(x, (1,), keepdims=True), (rows, cols))) * b.broadcast_to(w, (rows, cols))
    b.output("z", z)
    b.output("dbias", b.reduce_sum(z, (0,)))
    return b.build()


def test_a_reduction_loads_what_a_row_reducing_loop_stored(tmp_path: Path) -> None:
    """Regression: only fused loops' outputs counted as stored, so a column sum after a planned row loop
    recomputed its chain (the transformer's layer-norm backward + dropout, clusters 11 and 16: 109 -> 100 us)."""
    graph = normalised_bias_grad()
    plan = plan_cluster(graph, 0, PlanOptions())
    assert any(g.mapping.kind in (MappingKind.WARP_PER_ROW, MappingKind.BLOCK_PER_ROW) for g in plan.groups)
    part = reduction_part(cluster_source(graph, plan, "f").text)
    assert "out0_z[" in part and "in1_w[" not in part
    inputs = random_inputs(graph, 6)
    got = compile_cluster(graph, tmp_path)(inputs)
    checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in checks.values()), {n: v.reason for n, v in checks.items()}
