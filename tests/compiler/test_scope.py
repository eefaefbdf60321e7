"""Stitch scope: clusters, cycle refusal, remote stitching budget, reasons, extraction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate, evaluate_nodes, random_inputs
from stitchfleet.compiler.ir import DYNAMIC, Graph, GraphBuilder, Op, dumps, fingerprint, loads
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cpu.executable import compile_cluster


def _cycle_graph() -> Graph:
    """a = exp(x) feeds both a matmul and c; c = a + matmul(a): a and c only touch through the matmul."""
    b = GraphBuilder()
    x = b.parameter("x", (4, 4))
    w = b.parameter("w", (4, 4))
    a = b.tanh(b.exp(x))
    mm = b.opaque("MatMul", (a, w), (4, 4), "f32", "compute-intensive")
    c = b.add(a, mm)
    b.output("out", b.exp(b.neg(c)))
    return b.build()


def test_merge_through_outside_op_is_refused() -> None:
    graph = _cycle_graph()
    scope = find_clusters(graph)
    # before: one connected region would hold exp, tanh, add, neg, exp; the matmul sits between them
    assert [c.parts for c in scope.clusters] == [((2, 3),), ((5, 6, 7),)]
    refusals = [d for d in scope.decisions if d.action == "refuse merge"]
    assert len(refusals) == 1
    assert "would create cycle through node 4 'opaque.4' (OPAQUE)" in refusals[0].reason
    # the two regions depend on each other through the matmul: remote stitching must not merge them
    assert len(scope.clusters) == 2
    reasons = {e.node: e.reason for e in scope.excluded}
    assert reasons == {0: "graph input", 1: "graph input", 4: "opaque: MatMul (compute-intensive)"}


def test_connected_region_becomes_one_cluster() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (8, 16))
    mean = b.reduce_mean(x, (1,), keepdims=True)
    b.output("y", b.exp(x - mean))
    graph = b.build()
    scope = find_clusters(graph)
    assert len(scope.clusters) == 1
    cluster = scope.clusters[0]
    assert cluster.inputs == (0,)
    assert cluster.outputs == (graph.output_map["y"],)
    assert cluster.size == len(graph.nodes) - 1


def _independent_regions(count: int) -> Graph:
    b = GraphBuilder()
    for i in range(count):
        x = b.parameter(f"x{i}", (4, 8))
        mm = b.opaque("MatMul", (x, x), (4, 8), "f32", "compute-intensive")
        b.output(f"y{i}", b.exp(b.tanh(mm)))
    return b.build()


def test_remote_stitching_merges_independent_regions_within_budget() -> None:
    graph = _independent_regions(5)
    assert len(find_clusters(graph, remote_budget=1).clusters) == 5
    scope = find_clusters(graph, remote_budget=2)
    assert [len(c.parts) for c in scope.clusters] == [2, 2, 1]
    stitched = [d for d in scope.decisions if d.action == "remote stitch"]
    assert len(stitched) == 2
    assert all("independent of the cluster" in d.reason for d in stitched)
    assert [len(c.parts) for c in find_clusters(graph, remote_budget=8).clusters] == [5]
    with pytest.raises(ValueError, match="budget must be >= 1"):
        find_clusters(graph, remote_budget=0)


def test_dependent_regions_are_not_remote_stitched() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 4))
    first = b.exp(b.tanh(x))
    mm = b.opaque("MatMul", (first, first), (4, 4), "f32", "compute-intensive")
    b.output("y", b.exp(b.tanh(mm)))
    scope = find_clusters(b.build(), remote_budget=8)
    assert len(scope.clusters) == 2
    assert any(d.action == "new cluster" for d in scope.decisions)


def test_every_excluded_op_has_a_reason() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 8))
    lone = b.exp(x)
    odd = b.opaque("Frobnicate", (lone,), (4, 8), "f32", "unsupported")
    dyn = b.parameter("d", (DYNAMIC, 8))
    b.output("dyn", b.exp(b.tanh(dyn)))
    b.output("odd", b.tanh(odd))
    b.output("c", b.constant(3.0))
    graph = b.build()
    scope = find_clusters(graph)
    reasons = {e.op + ":" + e.name: e.reason for e in scope.excluded}
    assert reasons["OPAQUE:opaque.2"] == "unsupported op Frobnicate"
    assert reasons["EXP:exp.1"] == "single op: nothing to fuse"
    assert reasons["TANH:tanh.4"] == "dynamic shape"
    assert reasons["EXP:exp.5"] == "dynamic shape"
    assert reasons["CONSTANT:constant.7"] == "constant feeds no cluster"
    clustered = {n for c in scope.clusters for n in c.nodes}
    assert clustered | {e.node for e in scope.excluded} == set(range(len(graph.nodes)))


def test_constants_join_their_consumers_cluster() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 8))
    b.output("y", b.exp(x) * 2.0 + 1.0)
    graph = b.build()
    (cluster,) = find_clusters(graph).clusters
    constants = [n for n in cluster.nodes if graph.node(n).op is Op.CONSTANT]
    assert len(constants) == 2
    assert cluster.size == len(cluster.nodes) - 2


def test_extracted_cluster_is_standalone_and_computes_the_same() -> None:
    graph = _cycle_graph()
    scope = find_clusters(graph)
    inputs = random_inputs(graph, seed=3)
    values = evaluate_nodes(graph, inputs)
    for cluster in scope.clusters:
        sub = extract(graph, cluster.nodes)
        assert loads(dumps(sub)) == sub
        assert sub.metadata["source_outputs"] == cluster.outputs
        params = {str(p.attrs["name"]): p for p in sub.parameters}
        assert len(params) == len(cluster.inputs)
        feed = {
            name: values[src]
            for name, src in zip(sorted(params, key=lambda n: params[n].id), cluster.inputs, strict=True)
        }
        out = evaluate(sub, feed)
        for (_, node_id), source in zip(sub.outputs, cluster.outputs, strict=True):
            np.testing.assert_array_equal(out[sub.node(node_id).name], values[source])
    # same structure elsewhere -> same fingerprint
    first = extract(graph, scope.clusters[1].nodes)
    assert fingerprint(first) == fingerprint(extract(_cycle_graph(), scope.clusters[1].nodes))


def test_extract_rejects_bad_node_sets() -> None:
    graph = _cycle_graph()
    with pytest.raises(ValueError, match="cannot extract"):
        extract(graph, [99])
    with pytest.raises(ValueError, match="cannot extract"):
        extract(graph, [])


def test_lone_reshape_is_a_single_trivial_op() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 8))
    flat = b.reshape(x, (32,))
    b.output("mm", b.opaque("MatMul", (flat, flat), (1,), "f32", "compute-intensive"))
    scope = find_clusters(b.build())
    assert scope.clusters == ()
    assert {e.name: e.reason for e in scope.excluded}["reshape.1"] == "single trivial op"


def test_a_tensor_constant_is_a_cluster_input_and_the_cluster_runs(tmp_path: Path) -> None:
    """Regression: a cluster holding a tensor constant could not be lowered ("tensor constants are not
    lowered"), so the small transformer's cluster was left to TF; the constant is now read as an input."""
    b = GraphBuilder()
    x = b.parameter("x", (4, 3))
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    b.output("y", b.exp(b.tanh(b.add(x, b.constant(values)))))
    graph = b.build()
    scope = find_clusters(graph)
    (cluster,) = scope.clusters
    const = next(n.id for n in graph.nodes if n.op is Op.CONSTANT)
    assert const in cluster.inputs and const not in cluster.nodes
    assert any(e.node == const and e.reason.startswith("tensor constant") for e in scope.excluded)
    sub = extract(graph, cluster.nodes)
    x_value = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    inputs = {str(p.attrs["name"]): x_value if p.attrs["name"] == "x" else values for p in sub.parameters}
    (got,) = compile_cluster(sub, tmp_path, plan_cluster(sub, 0, PlanOptions()))(inputs).values()
    np.testing.assert_allclose(got, evaluate(graph, {"x": x_value})["y"], rtol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_reach_masks_answer_what_the_graph_walk_answers(seed: int) -> None:
    """Remote stitching asks, for each (cluster, region) pair, whether a path leaves one through an outside
    node and reaches the other. The masks (`_Reach`, added when DenseNet121's 43k walks cost 17 s of setup)
    must give the walk's answer on every pair of node sets that have no such path within themselves."""
    from stitchfleet.compiler.scope import _detour_free, _Reach, _Regions

    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    values = [b.parameter(f"p{k}", (4,)) for k in range(3)]
    for _ in range(40):
        a, c = rng.integers(0, len(values), 2)
        values.append(b.tanh(b.add(values[a], values[c])) if rng.random() < 0.3 else b.add(values[a], values[c]))
    b.output("out", values[-1])
    graph = b.build()
    regions, reach = _Regions(graph, range(len(graph.nodes))), _Reach(graph)
    ids = [n.id for n in graph.nodes if n.op is not Op.PARAMETER]
    checked = 0
    for _ in range(300):
        x, y = (set(rng.choice(ids, size=int(rng.integers(1, 3)), replace=False).tolist()) for _ in range(2))
        if x & y or regions.detour(x, x) is not None or regions.detour(y, y) is not None:
            continue
        walk = regions.detour(x, y) is None and regions.detour(y, x) is None
        assert _detour_free(reach.of(x), reach.of(y)) == walk, (x, y)
        checked += 1
    assert checked > 100


def test_held_nodes_are_boundaries_with_the_callers_reason() -> None:
    """A matmul's epilogue held for the TF library's fusion leaves the cluster; the rest still fuses."""
    b = GraphBuilder()
    x, w, bias = b.parameter("x", (4, 4)), b.parameter("w", (4, 4)), b.parameter("bias", (4,))
    mm = b.opaque("MatMul", (x, w), (4, 4), "f32", "compute-intensive")
    added = b.add(mm, b.broadcast(bias, (4, 4), (1,)))
    b.output("out", b.exp(b.neg(b.unary(Op.RELU, added))))
    graph = b.build()
    epilogue = {n.id for n in graph.nodes if n.op in (Op.BROADCAST, Op.ADD, Op.RELU)}
    why = "kept with MatMul for the library's fused epilogue"
    scope = find_clusters(graph, held=dict.fromkeys(epilogue, why))
    assert [set(c.nodes) for c in scope.clusters] == [{n.id for n in graph.nodes if n.op in (Op.NEG, Op.EXP)}]
    assert {e.node: e.reason for e in scope.excluded if e.node in epilogue} == dict.fromkeys(epilogue, why)
    assert len(find_clusters(graph).clusters[0].nodes) == 5  # without it the epilogue is stitched
