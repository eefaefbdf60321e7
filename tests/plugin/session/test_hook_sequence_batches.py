"""A sequence model whose input leaves both the batch and the time dimension open (`[None, None, features]`,
batches padded to their own longest sequence) trains stitched as plain TF does.

Regression: a Dense on such an input reshapes its result to a shape recomputed from the input's shape,
and the recomputation's read of that shape was moved onto a tensor of the same shape that the cluster
computes from the recomputed shape itself: the cluster's TF function had a cycle, its first call failed
('56 nodes in a cycle'), the step ran again as written and stitching reverted for the job.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 8


def test_open_batch_and_time_dimensions_stay_stitched(tmp_path: Path) -> None:
    graph = tf.Graph()
    hook, url = hooked(tmp_path, "sequences", STITCHFLEET_PROBE_STEPS="0")
    rng = np.random.default_rng(0)
    with graph.as_default():
        x = V1.placeholder(tf.float32, [None, None, 16], name="x")
        y = V1.placeholder(tf.int64, [None], name="y")
        h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(16)(x))
        logits = tf.keras.layers.Dense(4)(tf.reduce_mean(tf.nn.gelu(h), 1))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train = V1.train.AdamOptimizer(1e-3).minimize(loss, global_step=V1.train.get_or_create_global_step())
        feeds = {x: rng.standard_normal((8, 6, 16)).astype(np.float32), y: rng.integers(0, 4, 8)}
        with V1.train.MonitoredSession(hooks=[hook]) as session:
            losses = [float(session.run([loss, train], feeds)[0]) for _ in range(STEPS)]
    assert len(losses) == STEPS and all(np.isfinite(losses))
    assert hook.installed, "the clusters whose shape reads have a tensor at hand are stitched"
    assert not [e.detail for e in events(url, "revert")]
