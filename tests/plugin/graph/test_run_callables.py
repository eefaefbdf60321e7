"""A diverted run through the session's callable (`plugin/graph/run_callables.py`): the values `Session.run` gives,
run metadata filled, and every run the callable cannot take left to `Session.run` (None), TF's errors included."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.plugin.graph.run_callables import RunCallables

pytestmark = pytest.mark.tf


def _graph() -> tuple[tf.Graph, tf.Tensor, tf.Tensor, tf.Tensor, tf.Operation]:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        scale = tf.compat.v1.placeholder_with_default(tf.constant(2.0), [], name="scale")
        w = tf.compat.v1.get_variable("w", [3], initializer=tf.compat.v1.ones_initializer())
        y = tf.reduce_sum(x * w * scale, axis=1, name="y")
        update = w.assign_add(tf.fill([3], 0.5)).op
    return graph, x, scale, y, update


def test_the_callable_gives_what_session_run_gives_and_fills_run_metadata() -> None:
    graph, x, _, y, update = _graph()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.variables_initializer(graph.get_collection("variables")))
        callables = RunCallables(session)
        feeds = {x: np.arange(6, dtype=np.float64).reshape(2, 3), "scale:0": 3.0}  # float64 and a name, as users feed
        expected = session.run(y, feeds)
        traced = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        values = callables.run([y, update], feeds, traced, metadata)
        assert values is not None and values[1] is None  # an op fetched: None, as Session.run gives
        np.testing.assert_array_equal(values[0], expected)
        assert metadata.step_stats.dev_stats, "the trace asked for is in the run metadata"
        again = callables.run([y, update], {x: np.ones([4, 3], np.float32), "scale:0": 1.0}, traced, None)
        assert again is not None and again[0].shape == (4,)  # the same callable: another batch size
        assert len(callables._made) == 1
        [w] = graph.get_collection("variables")
        np.testing.assert_array_equal(session.run(w), np.full(3, 2.0, np.float32))  # the two updates ran


def test_runs_the_callable_cannot_take_are_left_to_session_run() -> None:
    graph, x, _, y, _ = _graph()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.variables_initializer(graph.get_collection("variables")))
        callables = RunCallables(session)
        wrong = {x: np.ones([2, 4], np.float32)}  # a shape the placeholder refuses
        assert callables.run([y], wrong, None, None) is None
        with pytest.raises(ValueError, match="Cannot feed value of shape"):
            session.run([y], wrong)  # TF's own error, as without the plugin
        assert callables.run([y], {x: np.ones([2, 3])}, None, None) is not None
        assert callables.run([y, x], {x: np.ones([2, 3])}, None, None) is None  # fed and fetched: TF's callable refuses
        assert callables.run([x], {x: tf.ones([2, 3])}, None, None) is None  # a tensor as a value: TF's TypeError
        with graph.as_default():
            sparse = tf.compat.v1.sparse_placeholder(tf.float32, name="sparse")
            total = tf.sparse.reduce_sum(sparse)
        value = tf.compat.v1.SparseTensorValue([[0, 0]], [1.0], [2, 2])
        assert callables.run([total], {sparse: value}, None, None) is None  # not a dense feed: Session.run's work
