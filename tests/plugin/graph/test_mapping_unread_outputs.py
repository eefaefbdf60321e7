"""Cluster outputs that no op of a training step reads (tf.gradients' halves for constants read them) are dropped.

The regression: every such output was stored by the kernel each step for readers grappler prunes (a seventh of the
Transformer's kernel time); and a static-shape loss, which no gradient reads, must keep the output it reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.plugin.graph.training_steps import step_values, update_path
from tests.plugin.site_harness import map_all, stitch, train

pytestmark = pytest.mark.tf

v1 = tf.compat.v1


def _training_graph() -> Any:
    """Products and a division by constants (tf.gradients writes both operands' halves; the constants' read the
    cluster's values and are pruned), then a loss of static shape that no gradient op reads."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [16, 32], name="x")
        w = v1.get_variable("w", [32], initializer=v1.random_normal_initializer(seed=3))
        h = tf.tanh(x * w, name="h")
        half = tf.constant(0.5, shape=[32], name="half") * h
        y = tf.divide(half * (1.0 + tf.tanh(h)), tf.constant(2.0, shape=[32], name="scale"), name="y")
        diff = tf.subtract(y, tf.constant(0.25), name="diff")
        loss = tf.reduce_mean(tf.square(diff), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return graph


def _readers(tensor: Any, site: Any) -> set[str]:
    return {r.name for r in tensor.consumers() if r.name not in site.internal_names}


def test_outputs_only_pruned_readers_read_are_dropped_and_the_losss_input_is_kept() -> None:
    graph = _training_graph()
    before, after = map_all(graph), map_all(graph, job=True)
    values, updates = step_values(graph), update_path(graph)
    assert "loss" in values and "loss" not in updates  # the static-shape loss: fetched, read by no gradient
    dropped = [c for site in after.sites for c in site.changes if c.action == "unread outputs"]
    assert dropped, "no output was dropped: the graph no longer has gradient halves for constants"
    for site in after.sites:
        for tensor in site.outputs:  # what stays is read by an op of the step
            assert _readers(tensor, site) & values, tensor.name
        assert len(site.graph.outputs) == len(site.outputs)  # the kernel stores only what stays
    outputs = {t.name for site in after.sites for t in site.outputs}
    gone = {t.name for site in before.sites for t in site.outputs} - outputs
    assert gone, "the job's mapping stores as much as a mapping without the step's readers"
    for site in before.sites:
        for tensor in site.outputs:
            if tensor.name in gone:  # read by nothing the step runs: the constants' gradient halves only
                readers = _readers(tensor, site)
                assert not readers & values and all(r.startswith("gradients/") for r in readers), readers
    assert any("diff" in site.internal_names for site in after.sites), "the loss's input is no longer stitched"
    assert "diff:0" in outputs, "the loss's input was dropped: TF's loss would recompute the cluster's ops"


def test_the_stitched_job_trains_to_the_same_losses_with_fewer_outputs() -> None:
    graph = _training_graph()
    stitched = stitch(graph, job=True)
    assert stitched.sites and not stitched.refused, stitched.refused
    plain = train(stitched, 6, on=False)
    fused = train(stitched, 6, on=True)
    np.testing.assert_allclose(fused, plain, rtol=2e-5)
    assert plain[-1] < plain[0]
    assert all(k.calls == 6 for k in stitched.kernels), "a stitched kernel did not run every step"
