"""Baseline planners: kernel counts on graphs small enough to count by hand."""

from __future__ import annotations

from benchmarks.suite import build_case
from stitchfleet.compiler.baselines import per_op, xla_style
from stitchfleet.compiler.ir import GraphBuilder, Op
from stitchfleet.compiler.scope import find_clusters


def _plans(graph):
    (cluster,) = find_clusters(graph).clusters
    return per_op(graph, cluster), xla_style(graph, cluster)


def test_layernorm_fwd_per_op_vs_xla() -> None:
    graph = build_case("layernorm_fwd", (8, 16), "f32")
    by_op, xla = _plans(graph)
    # mean, sub, square, var, +eps, rsqrt, *rstd, *gamma, +beta: broadcasts, reshapes, constants are free
    assert by_op.kernel_count == 9
    # two reductions end kernels; the normalisation is one loop fusion
    assert xla.kernel_count == 3
    reasons = sorted(k.reason for k in xla.kernels)
    assert reasons == [
        "reduction ends a kernel",
        "reduction ends a kernel",
        "value used outside the cluster is materialised",
    ]
    # the cheap centering (x - mean) is duplicated into the variance and the output kernels
    sub = next(n.id for n in graph.nodes if n.op is Op.SUB)
    assert sum(sub in k.nodes for k in xla.kernels) == 2


def test_astitch_fig7_xla_forms_four_kernels() -> None:
    graph = build_case("astitch_fig7", (2, 128), "f32")
    by_op, xla = _plans(graph)
    assert by_op.kernel_count == 6  # add, reduce, divide, power, reduce, multiply
    assert xla.kernel_count == 4  # as the paper says: the divide has two consumers and is not duplicated
    assert any(k.reason.startswith("expensive DIV with 2 consumers") for k in xla.kernels)


def test_sibling_reductions_share_a_multi_output_kernel() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (8, 16))
    b.output("s", b.reduce_sum(b.exp(x), (0,)))
    b.output("m", b.reduce_max(b.square(x), (0,)))
    b.output("r", b.reduce_sum(b.neg(x), (1,)))  # different reduced dims: not a sibling
    graph = b.build()
    (cluster,) = find_clusters(graph).clusters
    plan = xla_style(graph, cluster)
    assert len(cluster.parts) == 3  # three independent regions, remote-stitched
    assert plan.kernel_count == 2
    multi = [k for k in plan.kernels if len(k.roots) == 2]
    assert len(multi) == 1
    assert multi[0].reason == "multi-output fusion of sibling reductions"


def test_dependent_reductions_are_not_siblings() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (8, 16))
    first = b.reduce_sum(x, (1,), keepdims=True)
    b.output("second", b.reduce_sum(x * first, (1,)))
    graph = b.build()
    (cluster,) = find_clusters(graph).clusters
    assert xla_style(graph, cluster).kernel_count == 2


def test_layernorm_bwd_fuses_column_and_row_siblings() -> None:
    graph = build_case("layernorm_bwd", (8, 16), "f32")
    by_op, xla = _plans(graph)
    assert by_op.kernel_count > xla.kernel_count
    # dgamma+dbeta (column) share one kernel; the two row means share another; dx is the last
    assert xla.kernel_count == 3
    assert sorted(len(k.roots) for k in xla.kernels) == [1, 2, 2]
