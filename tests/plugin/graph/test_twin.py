"""The stitched twin (`plugin.twin`): the copy of what depends on the clusters, and runs diverted onto it.

Small TF1 graphs with a stand-in "cluster" (an op whose downstream gets copied): the user's graph
is left exactly as built, the copy computes the same values and updates the same variables,
colocation with shared variables survives, TF1 while loops are copied whole, and a diverted run
keeps the structure of its fetches.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.plugin.graph.mapping import Site
from stitchfleet.plugin.graph.twin import Diverter, Twin, TwinError, build
from stitchfleet.plugin.graph.twin_mark import PREFIX

pytestmark = pytest.mark.tf

Pair = collections.namedtuple("Pair", ["loss", "step"])


def _site(*ops: Any) -> Site:
    return Site(index=0, graph=None, inputs=[], outputs=[op.outputs[0] for op in ops], internal=list(ops))  # type: ignore[arg-type]


def _model() -> tuple[Any, dict[str, Any]]:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 3], initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
        h = tf.matmul(x, w, name="h")
        act = tf.nn.gelu(h + 0.5, name="act")  # the stand-in cluster: everything after it is copied
        loss = tf.reduce_mean(tf.square(act), name="loss")
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step, name="train")
        init = tf.compat.v1.global_variables_initializer()
    return graph, {"x": x, "w": w, "act": act, "loss": loss, "step": step, "train": train, "init": init}


def _feed(model: dict[str, Any]) -> dict[Any, Any]:
    return {model["x"]: np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)}


@contextlib.contextmanager
def _attached() -> Iterator[tuple[dict[str, Any], tf.compat.v1.Session, Diverter]]:
    """The test model's ops, a session of its graph (variables initialised) and a diverter attached to it."""
    graph, model = _model()
    twin = build(graph, [_site(model["act"].op)])
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(model["init"])
        diverter = Diverter(twin)
        diverter.attach(session)
        yield model, session, diverter


def test_the_users_graph_is_left_as_built() -> None:
    graph, model = _model()
    before = {n.name: n for n in graph.as_graph_def().node}
    twin = build(graph, [_site(model["act"].op)])
    after = {n.name: n for n in graph.as_graph_def().node if not n.name.startswith(f"{PREFIX}/")}
    assert after == before
    assert "loss" in twin.members and "train" in twin.members and "h" not in twin.members
    assert "w" not in twin.members and "x" not in twin.members  # state and sources are shared


def test_the_copy_trains_like_the_original_and_updates_the_same_variables() -> None:
    losses: dict[str, list[float]] = {}
    for path in ("original", "twin"):
        graph, model = _model()
        twin = build(graph, [_site(model["act"].op)])
        loss, train = model["loss"], model["train"]
        if path == "twin":
            loss, train = twin.tensor(loss), twin.op(train)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(model["init"])
            losses[path] = [float(session.run([loss, train], _feed(model))[0]) for _ in range(5)]
            assert session.run(model["step"]) == 5  # the global step the original graph reads moved
    np.testing.assert_allclose(losses["twin"], losses["original"], rtol=1e-6)
    assert losses["original"][-1] < losses["original"][0]


def test_colocation_with_shared_variables_is_kept() -> None:
    graph, model = _model()
    build(graph, [_site(model["act"].op)])
    copied = graph.get_operation_by_name(f"{PREFIX}/train/update_w/ResourceApplyAdam")
    assert copied.colocation_groups() == [b"loc:@w"]


def test_a_diverted_run_keeps_the_structure_of_its_fetches() -> None:
    graph, model = _model()
    twin = build(graph, [_site(model["act"].op)])
    executed: list[set[str]] = []
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(model["init"])
        diverter = Diverter(twin)
        diverter.attach(session)
        fetches = {"pair": Pair(model["loss"], "global_step:0"), "ops": [model["train"]], "name": "loss:0"}
        for armed in (False, True):
            diverter.armed = armed
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)
            metadata = tf.compat.v1.RunMetadata()
            out = session.run(fetches, _feed(model), options=options, run_metadata=metadata)
            assert isinstance(out["pair"], Pair) and out["ops"] == [None]
            assert out["pair"].loss == pytest.approx(out["name"])
            assert not diverter.armed  # one run per arming
            executed.append({n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats})
        assert session.run(model["step"]) == 2
    plain, diverted = executed
    assert not any(name.startswith(f"{PREFIX}/") for name in plain)
    assert any(name.startswith(f"{PREFIX}/") for name in diverted)
    assert "loss" not in diverted and "train" not in diverted  # the original's copied ops did not run


def test_a_feed_into_the_copy_is_not_diverted() -> None:
    graph, model = _model()
    twin = build(graph, [_site(model["act"].op)])
    assert twin.diverts({model["x"]: 0})
    assert not twin.diverts({model["loss"]: 0.0})
    assert not twin.diverts({"loss:0": 0.0})
    with tf.compat.v1.Session(graph=graph) as session:
        diverter = Diverter(twin)
        assert not diverter.diverts(session, {})  # not attached
        diverter.attach(session)
        assert diverter.diverts(session, {model["x"]: 0}) and not diverter.diverts(session, {model["loss"]: 1.0})


def test_a_tf1_while_loop_that_depends_on_a_cluster_is_copied_whole() -> None:
    tf.compat.v1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
            act = tf.tanh(x, name="act")
            _, total = tf.compat.v1.while_loop(
                lambda i, s: i < 4, lambda i, s: (i + 1, s * 0.5 + act), [tf.constant(0), tf.zeros([3])]
            )
            out = tf.identity(total, name="out")
        twin = build(graph, [_site(act.op)])
    finally:
        tf.compat.v1.enable_control_flow_v2()
    loop_ops = [op for op in graph.get_operations() if op.type == "LoopCond" and not op.name.startswith(PREFIX)]
    assert loop_ops and all(op.name in twin.members for op in loop_ops)  # the counter's loop condition too
    with tf.compat.v1.Session(graph=graph) as session:
        values = {x: np.array([0.1, -2.0, 3.0], np.float32)}
        np.testing.assert_allclose(session.run(twin.tensor(out), values), session.run(out, values), rtol=1e-6)


def test_no_op_downstream_refuses_the_copy() -> None:
    graph = tf.Graph()
    with graph.as_default():
        variable = tf.compat.v1.get_variable("v", [2])
    with pytest.raises(TwinError, match="no op depends"):
        build(graph, [_site(variable.op)])


def test_a_site_moves_onto_the_copy() -> None:
    graph, model = _model()
    twin: Twin = build(graph, [_site(model["act"].op)])
    h, act = graph.get_tensor_by_name("h:0"), model["act"]
    site = Site(index=3, graph=None, inputs=[h], outputs=[act], internal=[act.op])  # type: ignore[arg-type]
    moved = twin.site(site)
    assert moved.inputs == [h]  # computed before the cluster: shared
    assert moved.outputs[0].name == f"{PREFIX}/{act.name}" and moved.internal[0].name == f"{PREFIX}/{act.op.name}"
    assert moved.index == 3


def test_another_threads_run_is_not_diverted_and_keeps_the_arming() -> None:
    with _attached() as (model, session, diverter):
        diverter.armed = True
        seen: list[set[str]] = []

        def evaluate() -> None:  # an eval thread running the same session meanwhile
            metadata = tf.compat.v1.RunMetadata()
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)
            session.run(model["loss"], _feed(model), options=options, run_metadata=metadata)
            seen.append({n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats})

        other = threading.Thread(target=evaluate)
        other.start()
        other.join(timeout=60)
        assert seen and not any(name.startswith(f"{PREFIX}/") for name in seen[0])
        assert diverter.armed  # still armed for this thread's run
        session.run(model["train"], _feed(model))
        assert not diverter.armed


def test_a_copied_op_keeps_its_control_edge_from_a_shared_op() -> None:
    """Regression: a train op built under `control_dependencies(layer.updates)` (Keras batch norm's moving
    averages) waits for update ops the copy shares when no cluster is upstream of them; import_graph_def
    takes only tensors in its input map, so building the copy raised TypeError and the hook left the job
    unstitched. The edge is now set on the copy after import: it still waits for the shared update."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 4], name="x")
        counter = tf.Variable(0.0, name="counter")
        update = counter.assign_add(1.0, read_value=False, name="update")  # an op without outputs
        act = tf.tanh(x, name="act")
        with tf.control_dependencies([update]):
            loss = tf.reduce_sum(tf.square(act), name="loss")
        init = tf.compat.v1.global_variables_initializer()
    square = graph.get_operation_by_name("Square")  # Sum reads it: only Square waits for the update
    assert square.control_inputs == [update]
    twin = build(graph, [_site(act.op)])
    copied = twin.op(square)
    assert copied is not square and copied.control_inputs == [update]
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        session.run(twin.tensor(loss), {x: np.ones((2, 4), np.float32)})
        assert session.run(counter) == 1.0  # the copy ran the shared update first, once


def test_detach_gives_the_session_its_own_run_back_and_leaves_a_later_wrapper() -> None:
    """Once stitching is over the hook detaches the diverter: a quiet step then calls the session's own run."""
    with _attached() as (model, session, diverter):
        assert "run" in vars(session)
        diverter.armed = True
        diverter.detach()
        assert "run" not in vars(session) and not diverter.armed and diverter.session is None
        assert session.run(model["loss"], _feed(model)) > 0  # the class's own run
    with _attached() as (model, session, diverter):
        calls: list[object] = []
        ours = session.run

        def later(fetches: Any, *args: Any, **kwargs: Any) -> Any:  # set over ours by someone else
            calls.append(fetches)
            return ours(fetches, *args, **kwargs)

        session.run = later
        diverter.detach()
        assert vars(session)["run"] is later  # not ours to take away
        session.run(model["loss"], _feed(model))
        assert calls == [model["loss"]]
