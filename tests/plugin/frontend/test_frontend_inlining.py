"""Functional control flow: calls and constant-predicate conds are inlined, fed predicates stay."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import cond_v2

from stitchfleet.plugin.frontend.converter import convert_graph_def
from stitchfleet.plugin.frontend.inlining import inline_functions

pytestmark = pytest.mark.tf
v1 = tf.compat.v1


def _relu6_twice(x: Any) -> Any:
    return tf.nn.relu6(x * 2.0) + 1.0


_body = tf.function(_relu6_twice)  # a PartitionedCall in the graph it is called in


def _graph(pred: Any) -> tuple[Any, Any]:
    """x -> a function call -> a v2 cond on `pred` -> y, both functional ops in the GraphDef."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [4, 8], name="x")
        called = _body(x)
        y = cond_v2.cond_v2(pred(), lambda: tf.tanh(called), lambda: called * 3.0)
        tf.identity(tf.reduce_sum(y * y, axis=1), name="out")
    return graph.as_graph_def(), x


def _run(graph_def: Any, feed: dict[str, Any]) -> Any:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with v1.Session(graph=graph) as session:
        return session.run("out:0", feed)


def test_constant_cond_and_call_are_inlined_with_tf_values() -> None:
    graph_def, _ = _graph(lambda: tf.constant(True))
    assert {n.op for n in graph_def.node} & {"If", "StatelessIf"}
    inlined = inline_functions(graph_def)
    ops = {n.op for n in inlined.node}
    assert not ops & {"If", "StatelessIf", "PartitionedCall", "StatefulPartitionedCall"}, ops
    feed = {"x:0": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    np.testing.assert_allclose(_run(inlined, feed), _run(graph_def, feed), rtol=1e-6)
    conversion = convert_graph_def(graph_def, "g")
    fates = {d.op_type: d.fate for d in conversion.ops.values()}
    assert fates["Relu6"] == "lowered" and fates["Tanh"] == "lowered"
    assert "boundary" not in {d.fate for d in conversion.ops.values() if d.op_type != "Placeholder"}


def test_a_fed_predicate_keeps_its_cond_with_static_output_shapes() -> None:
    """A placeholder with a default (Keras' learning phase) may be fed: the If stays, its shapes stay static."""
    graph_def, _ = _graph(lambda: v1.placeholder_with_default(True, [], name="training"))
    inlined = inline_functions(graph_def)
    assert {n.op for n in inlined.node} & {"If", "StatelessIf"}
    conversion = convert_graph_def(graph_def, "g")
    cond = next(d for d in conversion.ops.values() if d.op_type in ("If", "StatelessIf"))
    assert cond.reason == "control flow"
    after = [d for d in conversion.ops.values() if d.op_type in ("Mul", "Sum")]
    assert after and all(d.fate == "lowered" for d in after), after


def test_an_inlined_call_keeps_its_side_effects_ordered() -> None:
    graph = tf.Graph()
    with graph.as_default():
        counter = v1.get_variable("counter", [], initializer=v1.zeros_initializer(), use_resource=True)
        x = v1.placeholder(tf.float32, [3], name="x")

        def step(x: Any) -> Any:
            counter.assign_add(1.0)
            return x * 2.0

        tf.identity(tf.function(step)(x), name="out")
    inlined = inline_functions(graph.as_graph_def())
    nodes = {n.name: n for n in inlined.node}
    call = next(n for n in inlined.node if n.op == "IdentityN")
    effects = [nodes[i[1:]].op for i in call.input if i.startswith("^")]
    assert "AssignAddVariableOp" in effects, list(call.input)
    with v1.Session(graph=tf.Graph()) as session:
        tf.graph_util.import_graph_def(inlined, name="")
        session.run("counter/Assign")
        session.run("out:0", {"x:0": np.ones(3, np.float32)})
        assert session.run("counter/Read/ReadVariableOp:0") == 1.0
