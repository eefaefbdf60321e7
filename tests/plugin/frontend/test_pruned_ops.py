"""What no variable write reads (tf.gradients' halves for constants, the loss) stays with TF: plain TF prunes it."""

from __future__ import annotations

from typing import Any

import pytest
import tensorflow as tf

from stitchfleet.compiler.pipeline import Options, compile_graph
from stitchfleet.plugin.frontend import pruned_ops
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.training_steps import update_path

pytestmark = pytest.mark.tf

v1 = tf.compat.v1


def _training_graph() -> Any:
    """A division by a constant and a product with a constant, whose gradients tf.gradients writes for both operands
    (the constants' halves are tied to the step by the `tuple` groups' control edges only), a moving average (a
    write of a non-trainable variable) and the loss, fetched by the job."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [16, 32], name="x")
        w = v1.get_variable("w", [32])
        scale = tf.constant(2.0, shape=[32], name="scale")
        h = tf.tanh(x * w, name="h")
        y = tf.divide(h, scale, name="y") * tf.constant(3.0, shape=[32], name="gain")
        loss = tf.reduce_mean(tf.square(y), name="loss")
        average = v1.train.ExponentialMovingAverage(0.9)
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.control_dependencies([train]):
            v1.group(average.apply([w]), name="train_op")
    return graph


def test_ops_no_variable_write_reads_are_held_with_their_reason() -> None:
    graph = _training_graph()
    conversion = convert(graph, name="t")
    held = pruned_ops.held(conversion, update_path(graph))
    names = {conversion.origins[n].op for n in held if n in conversion.origins}
    # the constants' gradient halves: plain TF never runs them (grappler turns them into NoOps)
    assert "gradients/y_grad/RealDiv_1" in names  # d(h / scale) / d(scale)'s first part
    assert any(name.startswith("gradients/mul_1_grad/") for name in names)  # d(y * gain) / d(gain)
    assert "loss" in names  # fetched, read by no write: TF's op computes it, as in plain TF
    # what the update reads stays stitchable: the forward pass, the weight's gradient, the moving average's math
    for needed in ("h", "y", "gradients/h_grad/TanhGrad", "gradients/y_grad/RealDiv"):
        assert needed not in names
    assert {pruned_ops.REASON} == set(held.values())


def test_the_compilers_clusters_hold_none_of_them() -> None:
    graph = _training_graph()
    conversion = convert(graph, name="t")
    held = pruned_ops.held(conversion, update_path(graph))
    art = compile_graph(conversion.graph, Options(origins=frozenset(conversion.origins), held=held))
    origins = conversion.origins
    inside = {origins[n].op for c in art.need_clusters().clusters for n in c.nodes if n in origins}
    assert inside, "the update path's elementwise ops still form clusters"
    assert not inside & {conversion.origins[n].op for n in held if n in conversion.origins}
