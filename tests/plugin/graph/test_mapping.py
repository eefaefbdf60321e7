"""`map_cluster` on small TF graphs: clusters drawn through a TF op, interior tensors read outside, refusals.

Each test draws a cluster the way the compiler's scope pass may (a node set of the converted
graph, extracted and planned), shows what the old mapping could not do with it ("before"),
then checks the mapped site: its tensors, and its cluster graph evaluated on TF's input
values against TF's output values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph, Op
from stitchfleet.compiler.pipeline import Options, compile_graph
from stitchfleet.compiler.plan import StitchPlan, plan_cluster
from stitchfleet.compiler.subgraph import extract
from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.cluster_ops import UNREAD_KEY
from stitchfleet.plugin.graph.mapping import Site, UnmappableError, map_cluster
from stitchfleet.plugin.graph.rewrite import Installed, rewire
from stitchfleet.plugin.native.kernels import ClusterKernel
from tests.plugin.site_harness import CACHE, feeds

pytestmark = pytest.mark.tf

P = tf.compat.v1.placeholder


def _convert(build: Callable[[], None]) -> tuple[Any, Conversion]:
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph, convert(graph)


def _node(conversion: Conversion, tensor: str) -> int:
    return conversion.node_of(tensor)


def _ancestors(conversion: Conversion, ends: Iterable[str], starts: Iterable[str] = ()) -> set[int]:
    """IR nodes computing `ends`, back to (and including) `starts`, parameters and opaque nodes excluded."""
    graph = conversion.graph
    stops = {_node(conversion, t) for t in starts}
    found: set[int] = set()
    stack = [_node(conversion, t) for t in ends]
    while stack:
        node = stack.pop()
        if node in found or graph.node(node).op in (Op.PARAMETER, Op.OPAQUE):
            continue
        found.add(node)
        if node not in stops:
            stack += list(graph.node(node).inputs)
    return found


def _cluster(conversion: Conversion, members: set[int]) -> tuple[Graph, StitchPlan]:
    """The cluster graph and plan the compiler would hand over for `members`."""
    graph = conversion.graph
    constants = {i for m in members for i in graph.node(m).inputs if graph.node(i).op is Op.CONSTANT}
    cluster = extract(graph, members | constants).with_metadata(cluster=0)
    return cluster, plan_cluster(cluster, 0)


def _unmapped(conversion: Conversion, cluster: Graph) -> list[int]:
    """The cluster's inputs and outputs that hold no TF tensor (what the old mapping refused)."""
    ends = cluster.metadata.get_ints("source_inputs") + cluster.metadata.get_ints("source_outputs")
    return [n for n in ends if n not in conversion.origins]


def _assert_computes_tf(graph: Any, site: Site) -> None:
    """The site's cluster graph, fed TF's values of its input tensors, gives TF's values of its outputs."""
    with tf.compat.v1.Session(graph=graph) as session:
        values = feeds(graph)
        got_in, got_out = session.run([site.inputs, site.outputs], values)
    names = [str(p.attrs["name"]) for p in site.graph.parameters]
    result = evaluate(site.graph, dict(zip(names, got_in, strict=True)))
    assert len(site.graph.outputs) == len(site.outputs)
    for (name, _), want in zip(site.graph.outputs, got_out, strict=True):
        np.testing.assert_allclose(result[name], want, rtol=1e-5, atol=1e-6)


def _unpack_into_cluster() -> None:
    x = P(tf.float32, [2, 3, 4], name="x")
    a, b, c = tf.unstack(x, axis=1)
    tf.add(tf.tanh(a) * b, c, name="y")


def test_cluster_starting_inside_unpack_takes_the_whole_piece() -> None:
    graph, conversion = _convert(_unpack_into_cluster)
    pieces = [_node(conversion, f"unstack:{i}") for i in range(3)]
    members = _ancestors(conversion, ["y:0"], [f"unstack:{i}" for i in range(3)])
    cluster, plan = _cluster(conversion, members)
    slices = [conversion.graph.node(p).inputs[0] for p in pieces]
    assert sorted(_unmapped(conversion, cluster)) == sorted(slices)  # before: inputs are unpack's slices
    with pytest.raises(UnmappableError, match="cannot re-plan"):
        map_cluster(graph, conversion, 0, cluster)
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert [t.name for t in site.inputs] == ["x:0"] and [t.name for t in site.outputs] == ["y:0"]
    assert "unstack" in site.internal_names and site.graph is not cluster and site.plan is not plan
    _assert_computes_tf(graph, site)


def test_rewired_unpack_cluster_trains_the_same_value() -> None:
    graph, conversion = _convert(_unpack_into_cluster)
    members = _ancestors(conversion, ["y:0"], [f"unstack:{i}" for i in range(3)])
    site = map_cluster(graph, conversion, 0, *_cluster(conversion, members))
    assert site.plan is not None
    kernel = ClusterKernel(site.graph, site.plan, "cpu", CACHE)
    rewired = rewire(graph, [site], [kernel])
    assert isinstance(rewired.clusters[0], Installed)
    y = rewired.current(graph.get_tensor_by_name("y:0"))
    with tf.compat.v1.Session(graph=graph) as session:
        values = feeds(graph)
        off = session.run(y, {**values, rewired.switches: [False]})
        on = session.run(y, {**values, rewired.switches: [True]})
    np.testing.assert_allclose(on, off, rtol=1e-6)
    assert kernel.calls == 1


def test_cluster_ending_inside_unpack_ends_on_its_output_and_leaves_the_other_pieces() -> None:
    def build() -> None:
        x = P(tf.float32, [2, 3, 4], name="x")
        w = tf.constant(np.ones((4, 4), np.float32))
        pieces = tf.unstack(tf.tanh(x, name="t"), axis=1)
        for i, piece in enumerate(pieces):
            tf.matmul(piece, w, name=f"mm{i}")

    graph, conversion = _convert(build)
    first_slice = conversion.graph.node(_node(conversion, "unstack:0")).inputs[0]
    cluster, plan = _cluster(conversion, {_node(conversion, "t:0"), first_slice})
    assert _unmapped(conversion, cluster) == [first_slice]  # before: an output is unpack's first slice
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert {t.name for t in site.outputs} == {"t:0", "unstack:0"}
    # unstack:1 and :2 are read by outside matmuls; the cluster does not compute them: the original op does
    assert "unstack" in site.internal_names
    _assert_computes_tf(graph, site)


def test_interior_tensor_read_outside_becomes_an_extra_output() -> None:
    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        t = tf.tanh(x, name="t")
        tf.exp(t * 2.0, name="y")
        tf.raw_ops.ZerosLike(x=t, name="z")  # reads t in TF, not in the IR (it only needs the shape)

    graph, conversion = _convert(build)
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    assert [conversion.origins[n].name for n in cluster.metadata.get_ints("source_outputs")] == ["y:0"]
    with pytest.raises(UnmappableError, match="cannot re-plan"):  # before: "interior tensor t:0 feeds 'z'"
        map_cluster(graph, conversion, 0, cluster)
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert [t.name for t in site.outputs] == ["y:0", "t:0"]
    assert site.graph.metadata.get_ints("source_outputs")[-1] == _node(conversion, "t:0")
    _assert_computes_tf(graph, site)


def test_cluster_that_needs_no_change_keeps_the_compilers_graph_and_plan() -> None:
    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        tf.exp(tf.tanh(x) * 2.0, name="y")

    graph, conversion = _convert(build)
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert site.graph is cluster and site.plan is plan
    assert map_cluster(graph, conversion, 0, cluster).plan is None
    _assert_computes_tf(graph, site)


def test_pipeline_fed_origins_hands_over_clusters_planned_once() -> None:
    """One-way compile: fed the frontend's origins, the pipeline draws the Unpack cluster at TF op granularity
    (every input and output a TF tensor), and the site keeps the compiler's graph and plan: no re-plan."""
    graph, conversion = _convert(_unpack_into_cluster)
    art = compile_graph(conversion.graph, Options(origins=frozenset(conversion.origins)))
    assert art.cluster_graphs
    for i, (cluster, plan) in enumerate(zip(art.cluster_graphs, art.stitch, strict=True)):
        assert isinstance(plan, StitchPlan) and not _unmapped(conversion, cluster)
        site = map_cluster(graph, conversion, i, cluster, plan)
        assert site.graph is cluster and site.plan is plan and not site.changes
        _assert_computes_tf(graph, site)


def test_a_cluster_changed_for_tf_says_why() -> None:
    """A change the plugin still makes (a hand-drawn cluster through a TF op; an interior tensor read
    outside) is planned by the compiler's re-entry, and the site keeps a decision per change."""
    graph, conversion = _convert(_unpack_into_cluster)
    members = _ancestors(conversion, ["y:0"], [f"unstack:{i}" for i in range(3)])
    site = map_cluster(graph, conversion, 0, *_cluster(conversion, members))
    assert [(d.stage, d.action, d.subject) for d in site.changes] == [("sites", "redraw", "cluster 0")]

    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        t = tf.tanh(x, name="t")
        tf.exp(t * 2.0, name="y")
        tf.raw_ops.ZerosLike(x=t, name="z")

    graph, conversion = _convert(build)
    site = map_cluster(graph, conversion, 0, *_cluster(conversion, _ancestors(conversion, ["y:0"])))
    (change,) = site.changes
    assert change.action == "extra outputs" and "t:0" in change.reason


# --- still refused, and why -------------------------------------------------------------------


def test_bf16_cluster_is_still_refused() -> None:
    def build() -> None:
        x = P(tf.bfloat16, [4, 8], name="x")
        tf.exp(tf.tanh(x) * 2.0, name="y")

    graph, conversion = _convert(build)
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    with pytest.raises(UnmappableError, match=r"bf16 values cannot cross tf\.numpy_function"):
        map_cluster(graph, conversion, 0, cluster, plan)


def test_a_stateful_value_the_ir_does_not_read_becomes_an_unread_input() -> None:
    """ZerosLike reads a random draw for its shape only: the IR's splat does not read it, TF's op does.
    Before, the walk went on into the draw and refused the cluster ("reaches RandomUniform op"); now the
    draw's value is an input of the stitched op (a PARAMETER nothing reads), so it runs after the draw as
    TF's ZerosLike does, and the draw itself stays outside, run once per step as before."""

    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        noise = tf.random.uniform([4, 8], name="noise")
        tf.add(tf.tanh(x), tf.raw_ops.ZerosLike(x=noise), name="y")

    graph, conversion = _convert(build)
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    draw = graph.get_operation_by_name("ZerosLike").inputs[0]
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert [t.name for t in site.inputs] == ["x:0", draw.name] and site.graph.metadata.get(UNREAD_KEY) == 1
    unread = site.graph.parameters[-1]
    assert not site.graph.consumers[unread.id] and unread.shape == (4, 8)
    assert "ZerosLike" in site.internal_names and not any(op.op_def.is_stateful for op in site.internal)
    assert site.plan is not None and site.plan is not plan  # the graph changed: planned again
    _assert_computes_tf(graph, site)


def test_a_cond_the_ir_does_not_read_becomes_an_unread_input() -> None:
    """The same for a cond's result: TF computes it outside the cluster, the stitched op waits for it."""

    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        flag = P(tf.bool, [], name="flag")
        branch = tf.cond(flag, lambda: x * 2.0, lambda: x * 3.0)
        tf.add(tf.tanh(x), tf.raw_ops.ZerosLike(x=branch), name="y")

    graph, conversion = _convert(build)
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    site = map_cluster(graph, conversion, 0, cluster, plan)
    branch = graph.get_operation_by_name("ZerosLike").inputs[0]
    assert site.inputs[-1] is branch and site.graph.metadata.get(UNREAD_KEY) == 1
    assert branch.op.name not in site.internal_names


def _delayed(compute: Callable[[Any], Any]) -> Callable[[], None]:
    """y = exp(t) * m, where m = compute(x) waits for t = tanh(x), as TF's gradient functions delay their work."""

    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        t = tf.tanh(x, name="t")
        with tf.control_dependencies([t]):
            m = tf.identity(compute(x), name="m")
        tf.multiply(tf.exp(t), m, name="y")

    return build


def _without_m(conversion: Conversion) -> set[int]:
    """The cluster computing y from t and m, m drawn outside it."""
    m = _node(conversion, "m:0")
    return {n for n in _ancestors(conversion, ["y:0"]) if n not in _ancestors(conversion, ["m:0"])} - {m}


def test_a_stateless_input_that_waits_for_the_cluster_only_loses_its_ordering_edge() -> None:
    """Regression: TF's gradient functions order Square_grad's and Erf_grad's ops after the incoming
    gradient; that edge, moved onto the stitched op, closed a cycle and kept the demo's clusters 6 and 7
    off. A stateless op's control edge only orders it: it is dropped, values stay the same."""
    graph, conversion = _convert(_delayed(lambda x: x * 3.0))
    cluster, plan = _cluster(conversion, _without_m(conversion))
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert sorted(t.name for t in site.inputs) == ["mul:0", "x:0"] and "mul" not in site.internal_names
    # control_dependencies put the edge on the constant 3.0 (mul waits through it)
    assert [op.name for op in site.ordering_readers] == ["mul/y"] and site.control_readers == []
    _assert_computes_tf(graph, site)
    assert site.plan is not None
    rewired = rewire(graph, [site], [ClusterKernel(site.graph, site.plan, "cpu", CACHE)])
    assert isinstance(rewired.clusters[0], Installed)
    assert graph.get_operation_by_name("mul/y").control_inputs == []


def test_a_random_draw_ordered_after_the_cluster_only_loses_its_ordering_edge() -> None:
    """A random draw that TF orders after t through its shape constant: the draw writes no variable
    the cluster's inputs come from, so the edge only orders (before: kept, moved onto the stitched op it
    made the op wait for itself through the draw, and the cluster was refused). Dropped: the draw's
    values are the same whenever it runs."""
    graph, conversion = _convert(_delayed(lambda x: x * tf.random.uniform([4, 8], seed=1)))
    cluster, plan = _cluster(conversion, _without_m(conversion))
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert [op.name for op in site.ordering_readers] == ["random_uniform/shape"] and site.control_readers == []
    assert sorted(t.name for t in site.inputs) == ["mul:0", "x:0"]


def _bumped(read_after_bump: bool) -> Callable[[], None]:
    """y = exp(t) * (x * v) where an update of v waits for t = tanh(x): through a NoOp (a gate) when the
    read comes first, directly when the read waits for the update."""

    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        v = tf.Variable(tf.ones([4, 8]), name="v")
        read = v.read_value()
        t = tf.tanh(x, name="t")
        ones = tf.ones([4, 8])  # made outside: the update itself, not a constant of it, gets the edge
        with tf.control_dependencies([t]):
            gate = tf.no_op(name="gate") if not read_after_bump else t
        with tf.control_dependencies([gate]):
            bump = tf.raw_ops.AssignAddVariableOp(resource=v.handle, value=ones, name="bump")
        if read_after_bump:
            with tf.control_dependencies([bump]):
                read = v.read_value()
        tf.multiply(tf.exp(t), tf.multiply(x, read, name="m"), name="y")

    return build


def test_a_variable_write_after_the_cluster_keeps_its_order_after_the_clusters_read() -> None:
    """The gate (a NoOp) orders the update of v after t; the cluster reads v. Dropping the gate's edge
    could run the update before the read: the gate stays a control reader (its edge moves onto the
    stitched op), so v is written after the stitched op read it, as in TF."""
    graph, conversion = _convert(_bumped(read_after_bump=False))
    members = _ancestors(conversion, ["y:0"])
    cluster, plan = _cluster(conversion, members)
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert [op.name for op in site.control_readers] == ["gate"] and site.ordering_readers == []
    assert any(t.op.type == "ReadVariableOp" for t in site.inputs)


def test_a_stateful_input_that_waits_for_the_cluster_leaves_what_reads_it_out() -> None:
    """v is read after an update that waits for t: moved onto the stitched op, the update's edge would
    make the op wait for itself through the read, and the read (a variable) cannot join the cluster.
    Before, the cluster was refused; now what reads it (m, y) leaves (`_shed`), and t and exp(t) stay a
    cluster the update waits for."""
    graph, conversion = _convert(_bumped(read_after_bump=True))
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert {"t", "Exp"} <= site.internal_names and not {"m", "y"} & site.internal_names
    assert [op.name for op in site.control_readers] == ["bump"]


def test_overlapping_clusters_rewire_in_either_order() -> None:
    """u = tanh(x) is computed by both clusters; the first rewired reroutes the second's reader of u."""

    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        u = tf.tanh(x, name="u")
        tf.exp(u, name="v")
        tf.multiply(u, 2.0, name="w")

    graph, conversion = _convert(build)
    first = map_cluster(graph, conversion, 0, *_cluster(conversion, _ancestors(conversion, ["v:0"])))
    second = map_cluster(graph, conversion, 1, *_cluster(conversion, _ancestors(conversion, ["w:0"])))
    assert {t.name for t in first.outputs} == {"u:0", "v:0"} and "u" in second.internal_names
    kernels = [ClusterKernel(s.graph, s.plan, "cpu", CACHE) for s in (first, second) if s.plan is not None]
    rewired = rewire(graph, [first, second], kernels)
    assert all(isinstance(c, Installed) for c in rewired.clusters), rewired.clusters
    outs = [rewired.current(graph.get_tensor_by_name(f"{k}:0")) for k in ("v", "w")]
    with tf.compat.v1.Session(graph=graph) as session:
        values = feeds(graph)
        on = session.run(outs, {**values, rewired.switches: [True, True]})
        off = session.run(outs, {**values, rewired.switches: [False, False]})
    for a, b in zip(on, off, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert all(k.calls == 1 for k in kernels)


def test_second_cluster_closing_a_cycle_through_the_first_is_left_off() -> None:
    """Two clusters each free of cycles, yet each feeds the other through a matmul (as remote
    stitching of a forward and a backward recurrence can pair them): the second is refused,
    and the switches count installed clusters only (a third one takes the second switch)."""

    def build() -> None:
        x, y = P(tf.float32, [4, 4], name="x"), P(tf.float32, [4, 4], name="y")
        w = tf.constant(np.eye(4, dtype=np.float32))
        f1 = tf.tanh(x, name="f1")
        tf.exp(tf.matmul(f1, w), name="f2")
        h1 = tf.tanh(y, name="h1")
        tf.exp(tf.matmul(h1, w), name="h2")
        tf.exp(tf.sigmoid(x), name="k")

    graph, conversion = _convert(build)
    n = {name: _node(conversion, f"{name}:0") for name in ("f1", "f2", "h1", "h2")}
    sites = [
        map_cluster(graph, conversion, 0, *_cluster(conversion, {n["f1"], n["h2"]})),
        map_cluster(graph, conversion, 1, *_cluster(conversion, {n["f2"], n["h1"]})),
        map_cluster(graph, conversion, 2, *_cluster(conversion, _ancestors(conversion, ["k:0"]))),
    ]
    kernels = [ClusterKernel(s.graph, s.plan, "cpu", CACHE) for s in sites if s.plan is not None]
    rewired = rewire(graph, sites, kernels)
    first, second, third = rewired.clusters
    assert isinstance(first, Installed) and isinstance(third, Installed)
    assert isinstance(second, str) and "a cycle: outside TF op 'MatMul_1'" in second
    outs = [rewired.current(graph.get_tensor_by_name(f"{k}:0")) for k in ("f2", "h2", "k")]
    with tf.compat.v1.Session(graph=graph) as session:
        values = feeds(graph)
        on = session.run(outs, {**values, rewired.switches: [False, True]})  # one switch per installed cluster
        off = session.run(outs, {**values, rewired.switches: [False, False]})
    for a, b in zip(on, off, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert [k.calls for k in kernels] == [0, 0, 1]


def test_shedding_ignores_paths_through_constants_shared_with_outside_ops() -> None:
    """Regression (MobileNetV2): the frontend keeps one IR node for ReLU6's 6.0; a path from it through an
    outside ReLU6 and a MatMul back into the cluster is no cycle, yet it made `_shed` refuse."""

    def build() -> None:
        x = P(tf.float32, [4, 4], name="x")
        v = tf.Variable(tf.ones([4, 4]), name="v")
        t = tf.tanh(x, name="t")
        ones = tf.ones([4, 4])
        with tf.control_dependencies([t]):
            bump = tf.raw_ops.AssignAddVariableOp(resource=v.handle, value=ones, name="bump")
        with tf.control_dependencies([bump]):
            read = v.read_value()
        q = tf.add(tf.exp(tf.nn.relu6(t)), tf.matmul(tf.nn.relu6(x), x), name="q")  # 6.0 in and out
        tf.multiply(q, tf.multiply(x, read, name="m"), name="y")

    graph, conversion = _convert(build)
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert {"t", "q"} <= site.internal_names and not {"m", "y"} & site.internal_names
    assert [op.name for op in site.control_readers] == ["bump"]


def test_ops_waiting_for_a_cluster_are_found_in_the_graphs_order_and_cycles_walked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outside ops waiting for the cluster's ops come from those ops' control outputs (before: a scan of the
    whole graph per cluster, issue 29's setup cost), in the order the graph made them: `a` waits for the last
    interior op and was made first. An acyclic cluster's closures are walked once (before: twice, the second
    walk a repeat of the first on the same site)."""
    from stitchfleet.plugin.graph import mapping

    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        t = tf.tanh(x, name="t")
        y = tf.multiply(tf.exp(t), 2.0, name="y")
        with tf.control_dependencies([y]):
            tf.constant(1.0, name="a")
        with tf.control_dependencies([t]):
            tf.constant(2.0, name="b")

    graph, conversion = _convert(build)
    walks: list[int] = []
    walk = mapping.closures
    monkeypatch.setattr(mapping, "closures", lambda *a, **k: walks.append(1) or walk(*a, **k))
    cluster, plan = _cluster(conversion, _ancestors(conversion, ["y:0"]))
    site = map_cluster(graph, conversion, 0, cluster, plan)
    assert {"t", "y"} <= site.internal_names
    assert [op.name for op in site.ordering_readers] == ["a", "b"] and site.control_readers == []
    assert walks == [1]
