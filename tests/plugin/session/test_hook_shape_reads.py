"""A job with `None` batch and sequence dimensions whose cluster reads a shape its own output has: the dispatch
op's TF path (its fallback function) recomputes that shape from a tensor the cluster holds, never from one it
computes from that shape (`recompute.recomputed`).

Regression (session 9, a bucketed text classifier: tokens [None, None], Keras layers, Adam): Mean's gradient
broadcasts to `Shape(x)`; the clone read that shape from its own `BroadcastTo` output, which has x's shape, so the
fallback function held a cycle ("20 nodes in a cycle"): the first step on the twin failed and stitching was
reverted for the whole job at step 9."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.session.hook import StitchHook  # noqa: E402
from tests.plugin.hook_harness import assert_tf_paths_match, events, hooked  # noqa: E402
from tests.plugin.session.test_hook_signatures import SETTLE_S  # noqa: E402

pytestmark = pytest.mark.tf
LENGTHS = (16, 32, 16, 8, 32, 16, 16, 32, 8, 16, 32, 16, 16, 8, 32, 16, 32, 16, 16, 32)


def classifier() -> Any:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        tokens = tf.compat.v1.placeholder(tf.int32, [None, None], name="tokens")
        labels = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
        seeded = tf.keras.initializers.GlorotUniform  # Keras draws unseeded initial values per graph
        x = tf.keras.layers.Embedding(100, 16, embeddings_initializer=tf.keras.initializers.RandomUniform(seed=1))(
            tokens
        )
        h = tf.keras.layers.LayerNormalization()(x)
        h = tf.keras.layers.Dense(32, activation="gelu", kernel_initializer=seeded(seed=2))(h)
        x = x + tf.keras.layers.Dense(16, kernel_initializer=seeded(seed=3))(h)
        logits = tf.keras.layers.Dense(4, kernel_initializer=seeded(seed=4))(tf.reduce_mean(x, axis=1))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits), name="loss")
        tf.compat.v1.train.AdamOptimizer(1e-2).minimize(loss, name="train")
    return graph


def train(hook: StitchHook | None) -> list[float]:
    graph, rng = classifier(), np.random.default_rng(0)
    losses = []
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
        for step, length in enumerate(LENGTHS):
            tokens = rng.integers(0, 100, (8, length)).astype(np.int32)
            feeds = {"tokens:0": tokens, "labels:0": (tokens[:, 0] % 4).astype(np.int64)}
            value, _ = session.run(["loss:0", "train"], feeds)
            losses.append(float(value))
            if step == 6 and hook is not None and hook.signatures is not None:
                assert hook.signatures.wait(SETTLE_S)
        if hook is not None:  # every cluster's TF path against the user's graph at a length no step fed
            tokens = rng.integers(0, 100, (8, 24)).astype(np.int32)
            other = {"tokens:0": tokens, "labels:0": (tokens[:, 0] % 4).astype(np.int64)}
            assert assert_tf_paths_match(session, hook, {graph.get_tensor_by_name(k): v for k, v in other.items()})
    return losses


def test_a_cluster_reading_a_shape_its_output_has_runs_without_a_cycle(tmp_path: Path) -> None:
    hook, url = hooked(tmp_path, "shape-reads", STITCHFLEET_SIGNATURE_STEPS="2")
    plain = train(None)
    losses = train(hook)
    reverts = [(e.reason, e.detail[:200]) for e in events(url, "revert")]
    assert reverts == [], reverts
    assert hook.controller is not None and hook.controller.job_reverted is None
    assert hook.installed, "nothing stitched: the test would prove nothing"
    np.testing.assert_allclose(losses, plain, rtol=1e-4)
