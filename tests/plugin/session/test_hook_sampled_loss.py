"""A word2vec job (NCE loss, a new batch size every step): its sampled-loss clusters are installed, and with every
switch off each cluster's TF path (the dispatch op's fallback function) computes what the user's graph computes.

Regressions (issue 34, the corpus' Horovod word2vec):
- an op outside a cluster reading the shape of a tensor inside it (the gradient of the per-example loss's
  `Reshape`, of `Mean`), where no input or output of the cluster had that shape, declined the cluster at rewrite
  ("... depends on the job's shape signature and no tensor at hand has it"); its value is now computed from the
  cluster inputs' dimensions (`rewrite.LiveReader`);
- once such a cluster installed, its fallback function read the sampler's expected counts where the labels
  `ones_like(logits) / num_true` belong: a tensor both recomputed for the call's shapes and read for its shape by a
  recomputed gradient shape was renamed to a same-shaped tensor for every read (`recompute.recomputed`). The job's
  losses left plain TF's on the first step that ran the twin (2e-3 relative), every switch off;
- the gradient of the gathered weights' `Slice` pads to `[batch + num_sampled, width]`, a dimension a constant
  apart from the batch: the fourth cluster was declined (`recompute._size`'s offset rule).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import assert_tf_paths_match, events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
VOCABULARY, WIDTH, SAMPLED = 3000, 32, 16
# warmup 5 (the twin runs at steps 3 and 4, every switch off), then baseline steps on the user's graph
SETTINGS = {"STITCHFLEET_WARMUP_STEPS": "5", "STITCHFLEET_BASELINE_STEPS": "1000", "STITCHFLEET_PROBE_STEPS": "0"}


def word2vec() -> tuple[Any, Any, Any, Any, Any]:
    """The skip-gram model of TF's word2vec tutorial (as in Horovod's example), at a small vocabulary."""
    graph = tf.Graph()
    with graph.as_default():
        V1.set_random_seed(0)
        inputs = V1.placeholder(tf.int32, [None], name="inputs")
        labels = V1.placeholder(tf.int32, [None, 1], name="labels")
        embeddings = tf.Variable(V1.random_uniform([VOCABULARY, WIDTH], -1.0, 1.0))
        weights = tf.Variable(V1.truncated_normal([VOCABULARY, WIDTH], stddev=1.0 / math.sqrt(WIDTH)))
        biases = tf.Variable(tf.zeros([VOCABULARY]))
        embedded = tf.nn.embedding_lookup(embeddings, inputs)
        sampled = V1.nn.nce_loss(weights, biases, labels, embedded, num_sampled=SAMPLED, num_classes=VOCABULARY)
        loss = tf.reduce_mean(sampled, name="loss")
        train = V1.train.GradientDescentOptimizer(1.0).minimize(loss)
    return graph, inputs, labels, loss, train


def batches(inputs: Any, labels: Any) -> list[dict[Any, np.ndarray]]:
    rng = np.random.default_rng(0)
    sizes = [int(n) for n in rng.integers(16, 33, 8) // 2 * 2]
    return [
        {inputs: rng.integers(0, VOCABULARY, n).astype(np.int32), labels: rng.integers(0, VOCABULARY, (n, 1))}
        for n in sizes
    ]


def test_sampled_loss_clusters_install_and_their_tf_path_computes_the_users_values(tmp_path: Path) -> None:
    graph, inputs, labels, loss, train = word2vec()
    hook, url = hooked(tmp_path, "word2vec", **SETTINGS)
    with graph.as_default(), V1.train.MonitoredSession(hooks=[hook]) as session:
        for feeds in batches(inputs, labels)[:3]:  # the first three steps: the user's graph
            session.run([loss, train], feeds)
        sampled = [
            installed
            for _, installed in hook.installed
            if any("sampled_losses" in t.name or "Mean" in t.name for t in installed.original)
        ]
        # at a batch size the setup did not see
        feeds = {inputs: np.arange(22, dtype=np.int32), labels: np.arange(22, dtype=np.int64)[:, None] * 7}
        assert assert_tf_paths_match(session, hook, feeds) > 0
    refused = [e.detail for e in events(url, "compile_failure")]  # the ledger is written once the session closed
    assert sampled, f"no cluster of the sampled loss installed; refused: {refused}"
    assert not [r for r in refused if "graph rewrite failed" in r], refused
