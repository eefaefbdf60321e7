"""A Keras CNN as users write it in TF1 graph mode, under the hook: it trains exactly as without the plugin.

Conv2D + BatchNormalization (training mode: its moving averages update through UPDATE_OPS, run as
control dependencies of the train op) + ReLU6, global pooling and a Dense head, Adam, the global
step, MonitoredSession. What the plugin stitches of it is asserted loosely (batch norm's own
clusters are not mapped yet: they read the moving statistics' variables inside); what matters is
that the losses and the moving statistics match a run without the plugin, step by step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.plugin.hook import StitchHook
from tests.plugin.hook_harness import hooked

pytestmark = pytest.mark.tf

STEPS = 20


def _model() -> tuple[Any, list[Any], dict[Any, Any], list[Any]]:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        tf.keras.utils.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [8, 16, 16, 3], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [8], name="y")
        h = x
        norms = []
        for filters in (8, 16):
            h = tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(h)
            norm = tf.keras.layers.BatchNormalization()
            h = tf.keras.layers.ReLU(6.0)(norm(h, training=True))
            norms.append(norm)
        logits = tf.keras.layers.Dense(10)(tf.keras.layers.GlobalAveragePooling2D()(h))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        step = tf.compat.v1.train.get_or_create_global_step()
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=step)
        rng = np.random.default_rng(0)
        feeds = {x: rng.standard_normal((8, 16, 16, 3)).astype(np.float32), y: rng.integers(0, 10, 8)}
        moving = [v for norm in norms for v in (norm.moving_mean, norm.moving_variance)]
    return graph, [loss, train], feeds, moving


def _train(hook: StitchHook | None) -> tuple[list[float], list[np.ndarray[Any, Any]]]:
    graph, fetches, feeds, moving = _model()
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
        losses = [float(session.run(fetches, feeds)[0]) for _ in range(STEPS)]
        statistics = session.run(moving)
    return losses, statistics


def test_a_keras_cnn_with_batch_norm_trains_as_without_the_plugin(tmp_path: Path) -> None:
    plain_losses, plain_moving = _train(None)
    hook, _ = hooked(tmp_path, "keras-cnn")
    losses, moving = _train(hook)
    assert hook.installed and hook.controller is not None and hook.controller.job_reverted is None
    assert min(hook.backend_calls.values()) > 0  # stitched steps ran
    np.testing.assert_allclose(losses, plain_losses, rtol=2e-5)
    for got, want in zip(moving, plain_moving, strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
