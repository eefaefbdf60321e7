"""`granularity`: clusters redrawn as unions of whole atoms, on hand-built IR graphs (no TensorFlow).

Each graph marks which nodes hold a TF tensor (`origins`); the others are intermediates of
one TF op's lowering, as the frontend leaves them. `redraw` (the pipeline's `op_clusters` stage)
and the pipeline fed origins are checked on a graph the scope pass cuts through one TF op.
"""

from __future__ import annotations

import dataclasses

import pytest

from stitchfleet.compiler import pipeline
from stitchfleet.compiler.decision import Decision
from stitchfleet.compiler.granularity import LEFT, RegroupError, atoms, cyclic, hull, redraw, regroup
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op, TensorType
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.scope import Cluster, Scope, find_clusters
from stitchfleet.compiler.subgraph import boundary


def _unpack_like() -> tuple[Graph, set[int]]:
    """x -> slice -> reshape (one TF op, the slice has no origin) -> tanh -> exp."""
    b = GraphBuilder()
    x = b.parameter("x", [2, 3, 4])
    piece = b.slice(x, [0, 0, 0], [2, 1, 4])
    flat = b.reshape(piece, [2, 4])
    t = b.tanh(flat)
    b.output("y", b.exp(t))
    graph = b.build()
    return graph, {n.id for n in graph.nodes} - {piece.id}


def _broadcast_then_cycle() -> tuple[Graph, set[int], dict[str, int]]:
    """p (a row sum) is broadcast inside TF op `mul`; `mul` also reads q = opaque(h), h in the cluster."""
    b = GraphBuilder()
    x = b.parameter("x", [4, 8])
    p = b.tanh(b.reduce_sum(x, [1], keepdims=True))
    h = b.tanh(x)
    q = b.op(Op.OPAQUE, [h], {"type": "MatMul", "reason": "compute-intensive"}, declared=TensorType(h.shape, h.dtype))
    spread = b.broadcast_to(p, (4, 8))
    y = spread * q
    b.output("y", y)
    graph = b.build()
    ids = {"x": x.id, "p": p.id, "h": h.id, "q": q.id, "spread": spread.id, "y": y.id}
    origins = {n.id for n in graph.nodes} - {spread.id}
    return graph, origins, ids


def test_atoms_join_nodes_through_intermediates_only() -> None:
    graph, origins = _unpack_like()
    by_node = atoms(graph, origins)
    slice_id, reshape_id = 1, 2
    assert by_node[slice_id] == by_node[reshape_id] == frozenset({slice_id, reshape_id})
    assert by_node[3] == frozenset({3})  # tanh reads a node with an origin: an atom of its own


def test_a_graphs_atoms_are_computed_once_for_all_its_clusters() -> None:
    """Regression: each cluster's regroup recomputed the whole graph's atoms (DenseNet121: 245 clusters,
    10 s of setup); the last graph's are kept while the graph and origins are the same."""
    graph, origins = _unpack_like()
    first = atoms(graph, origins)
    assert atoms(graph, set(origins)) is first  # equal origins, any collection
    other = origins - {3}
    assert atoms(graph, other) is not first and atoms(graph, other)[3] != first[3]  # other origins: recomputed


def test_a_cluster_starting_inside_a_tf_op_grows_to_its_start() -> None:
    graph, origins = _unpack_like()
    # the scope pass drew the cluster from the reshape on: its input (the slice) holds no TF tensor
    assert regroup(graph, origins, {2, 3, 4}) == frozenset({1, 2, 3, 4})


def test_a_cluster_ending_inside_a_tf_op_grows_to_its_end() -> None:
    graph, origins = _unpack_like()
    assert regroup(graph, origins, {1, 3, 4}) == frozenset({1, 2, 3, 4})


def test_a_whole_cluster_is_left_as_it_is() -> None:
    graph, origins = _unpack_like()
    assert regroup(graph, origins, {1, 2, 3}) == frozenset({1, 2, 3})


def test_an_atom_that_cannot_join_without_a_cycle_leaves_the_cluster() -> None:
    graph, origins, ids = _broadcast_then_cycle()
    members = {ids["p"] - 1, ids["p"], ids["h"], ids["spread"]}  # reduce, tanh(p), tanh(x), the broadcast
    assert not cyclic(graph, members)
    assert cyclic(graph, members | {ids["y"]})  # h -> opaque q -> y would come back
    assert regroup(graph, origins, members) == frozenset(members - {ids["spread"]})


def _shared_intermediate() -> tuple[Graph, set[int], dict[str, int]]:
    """u = exp(w) has no origin: two outputs of one TF op (v and v2) read it; v2 also reads opaque(w)."""
    b = GraphBuilder()
    x = b.parameter("x", [4, 8])
    w = b.tanh(x)
    u = b.exp(w)  # no origin: shared by two outputs of one TF op (v and v2)
    v = b.neg(u)
    q = b.op(Op.OPAQUE, [w], {"type": "MatMul", "reason": "compute-intensive"}, declared=TensorType(w.shape, w.dtype))
    v2 = u * q
    z = b.tanh(v)
    s = b.sigmoid(w)
    b.output("v2", v2)
    b.output("z", z)
    b.output("s", s)
    graph = b.build()
    origins = {n.id for n in graph.nodes} - {u.id}
    return graph, origins, {"w": w.id, "u": u.id, "v": v.id, "v2": v2.id, "z": z.id, "s": s.id}


def test_members_downstream_of_an_atom_that_leaves_leave_too() -> None:
    """When growth would close a cycle and removing the atom alone would open one, the members it
    feeds leave with it."""
    graph, origins, ids = _shared_intermediate()
    w, u, v, v2, z, s = (ids[k] for k in ("w", "u", "v", "v2", "z", "s"))
    members = {w, u, v, z, s}
    assert not cyclic(graph, members)
    assert cyclic(graph, members | {v2})  # w -> q -> v2
    assert cyclic(graph, members - {u, v})  # w -> u -> v -> z
    assert regroup(graph, origins, members) == frozenset({w, s})


def test_redraw_keeps_ids_and_says_why() -> None:
    graph, origins, ids = _shared_intermediate()
    scope = find_clusters(graph)
    (drawn,) = scope.clusters
    assert set(drawn.nodes) == {ids[k] for k in ("w", "u", "v", "z", "s")}  # the scope pass cut u's TF op
    (cluster,) = redraw(graph, origins, scope).clusters
    again = redraw(graph, origins, scope)
    assert cluster.id == drawn.id and cluster.nodes == (ids["w"], ids["s"]) and not cluster.refused
    assert (list(cluster.inputs), list(cluster.outputs)) == boundary(graph, cluster.nodes)
    assert cluster.parts == ((ids["w"], ids["s"]),)
    assert again.decisions[: len(scope.decisions)] == scope.decisions
    (said,) = again.decisions[len(scope.decisions) :]
    assert (said.stage, said.action, said.subject) == ("op_clusters", "redraw", "cluster 0")
    left = {e.node for e in again.excluded if e.reason == LEFT}
    assert left == {ids["u"], ids["v"], ids["z"]}


def test_redraw_keeps_a_cluster_with_nothing_left_in_its_slot() -> None:
    graph, origins, ids = _broadcast_then_cycle()
    members = (ids["h"], ids["spread"])
    inputs, outputs = boundary(graph, members)
    scope = Scope((Cluster(0, members, (members,), tuple(inputs), tuple(outputs)),), ())
    (kept,) = redraw(graph, origins, scope).clusters
    assert kept.nodes == members and "at most one op is left" in kept.refused
    art = pipeline.Artifacts(graph, clusters=scope)
    options = pipeline.Options(origins=frozenset(origins))
    art = dataclasses.replace(art, op_clusters=pipeline.op_clusters(art, options))
    art = dataclasses.replace(art, cluster_graphs=pipeline.cluster_graphs(art, options))
    (refusal,) = pipeline.stitch(art, pipeline.Options())
    assert isinstance(refusal, Decision) and (refusal.stage, refusal.reason) == ("op_clusters", kept.refused)


def test_the_pipeline_fed_origins_plans_the_redrawn_cluster_once() -> None:
    graph, origins, ids = _shared_intermediate()
    art = pipeline.compile_graph(graph, pipeline.Options(origins=frozenset(origins)))
    (cluster_graph,) = art.cluster_graphs
    assert cluster_graph.metadata.get("regrouped")
    assert sorted(cluster_graph.metadata.get_ints("source_nodes")) == [ids["w"], ids["s"]]
    (plan,) = art.stitch
    assert isinstance(plan, StitchPlan)
    assert art.report is not None and any(d.action == "redraw" for d in art.report.decisions)
    plain = pipeline.compile_graph(graph)  # no origins: every node is an op of its own
    assert plain.op_clusters is plain.clusters and not plain.cluster_graphs[0].metadata.get("regrouped")
    assert plain.report is not None and plain.report.clusters[0].nodes != art.report.clusters[0].nodes
    # the fleet's memory keys the cluster as the scope pass drew it: redrawing keeps the key
    assert art.report.clusters[0].fingerprint == plain.report.clusters[0].fingerprint


def test_constants_the_members_read_join_them() -> None:
    b = GraphBuilder()
    x = b.parameter("x", [4])
    two = b.constant(2.0)  # a scalar: kernels embed it (tensor constants stay inputs, see below)
    y = b.tanh(x * two)
    b.output("y", b.exp(y))
    graph = b.build()
    origins = {n.id for n in graph.nodes}
    members = {n.id for n in graph.nodes if n.op not in (Op.PARAMETER, Op.CONSTANT)}
    assert regroup(graph, origins, members) == frozenset(members | {two.id})


def test_nothing_left_to_stitch_is_an_error() -> None:
    graph, origins, ids = _broadcast_then_cycle()
    with pytest.raises(RegroupError, match="at most one op is left"):
        regroup(graph, origins, {ids["h"], ids["spread"]})


def test_hull_adds_every_node_between_members() -> None:
    graph, _, ids = _broadcast_then_cycle()
    # h -> opaque q -> y: y joining h needs q; p is on no path between them
    assert hull(graph, {ids["h"], ids["y"]}) == frozenset({ids["h"], ids["q"], ids["y"]})
    assert hull(graph, {ids["p"], ids["h"]}) == frozenset({ids["p"], ids["h"]})
    assert not cyclic(graph, hull(graph, {ids["h"], ids["y"]}))


def test_a_tensor_constant_stays_outside_and_a_scalar_joins() -> None:
    """Regression: regrouping pulled every constant a member reads into the cluster, tensor constants
    too, which kernels cannot hold (the small transformer's cluster failed: "tensor constants are not
    lowered"); they stay inputs now, as the scope pass leaves them."""
    b = GraphBuilder()
    x = b.parameter("x", [2, 3])
    table = b.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    half = b.constant(0.5)
    y = b.exp(b.tanh(b.add(b.mul(x, half), table)))
    b.output("y", y)
    graph = b.build()
    members = {n.id for n in graph.nodes if n.op not in (Op.PARAMETER, Op.CONSTANT)}
    drawn = regroup(graph, {n.id for n in graph.nodes}, members)
    assert table.id not in drawn and half.id in drawn
