"""A constant stands for FusedBatchNormV3's reserve_space_3 where a CPU cluster only hands it to its TF clone.

The regression: the layer-norm gradient's cluster read the forward op's reserve_space_3 (its IR never does; its TF
clone needs it when off), so every stitched step ran TF's forward batch norm, and all that feeds it, a second time
(the Transformer: 20 TF ops a step, 3 FusedBatchNormV3 among them). CPU gradient kernels ignore that value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.plugin.graph.cluster_ops import ignored_value
from tests.plugin.site_harness import feeds, stitch, train

pytestmark = pytest.mark.tf

v1 = tf.compat.v1


def _layer_norm_graph() -> Any:
    """Dense, Keras' LayerNormalization (a FusedBatchNormV3 in a TF1 graph), dense, a loss and its update: the
    second matmul parts the forward batch norm's cluster from its gradient's."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [64, 32], name="x")
        w = v1.get_variable("w", [32, 32], initializer=v1.random_normal_initializer(seed=5))
        w2 = v1.get_variable("w2", [32, 16], initializer=v1.random_normal_initializer(seed=6))
        norm = tf.keras.layers.LayerNormalization()(tf.matmul(x, w))
        tf.reduce_mean(tf.square(tf.tanh(tf.matmul(tf.nn.relu(norm), w2)) - 0.5), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(graph.get_tensor_by_name("loss:0"), name="train_op")
    return graph


def _forward(graph: Any) -> Any:
    [op] = [op for op in graph.get_operations() if op.type == "FusedBatchNormV3"]
    return op


def test_the_reserve_space_3_has_a_stand_in_of_the_cpu_kernels_rank_and_nothing_else_has() -> None:
    graph = _layer_norm_graph()
    forward = _forward(graph)
    value = ignored_value(forward.outputs[5])
    with v1.Session(graph=graph) as session:
        session.run(v1.global_variables_initializer())
        returned = np.asarray(session.run(forward.outputs[5], feeds(graph)))
    # the rank the kernel that runs here returns: oneDNN's a [0] vector, TF's Eigen kernel (oneDNN off, as TF leaves it
    # on a CPU without AVX-512's newer extensions) a scalar, which holds one value (session 40's AVX2 machine: a test
    # that asked every stand-in to be empty failed there)
    assert value is not None and value.ndim == returned.ndim and value.dtype == returned.dtype
    assert value.shape == (0,) * value.ndim and not value.any()
    assert all(ignored_value(t) is None for t in forward.outputs[:5])  # ranked outputs: read for their values


def test_a_stitched_step_no_longer_runs_the_forward_batch_norm_and_trains_the_same() -> None:
    graph = _layer_norm_graph()
    stitched = stitch(graph, job=True)
    assert stitched.sites and not stitched.refused, stitched.refused
    forward = _forward(graph)
    reads = [s for s in stitched.sites if forward.outputs[5] in s.inputs]
    assert reads, "no cluster reads the reserve space: the test no longer covers the stand-in"
    rewired = stitched.rewired
    assert rewired is not None
    with graph.as_default():
        loss = rewired.current(graph.get_tensor_by_name("loss:0"))
        init = v1.global_variables_initializer()
    values = {**feeds(graph), rewired.switches: np.ones(len(stitched.installed), bool)}
    with v1.Session(graph=graph) as session:
        session.run(init)
        metadata = v1.RunMetadata()
        session.run([loss, "train_op"], values, options=v1.RunOptions(trace_level=3), run_metadata=metadata)
    ran = {n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats}
    assert forward.name not in ran, "TF's forward batch norm ran beside the stitched one"
    plain, fused = train(stitched, 5, on=False), train(stitched, 5, on=True)
    np.testing.assert_allclose(fused, plain, rtol=2e-5)
    assert plain[-1] < plain[0]
