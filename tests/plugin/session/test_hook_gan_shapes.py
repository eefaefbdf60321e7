"""A DCGAN as TF1 users write it (the TensorFlow-Examples one: `None` batches, a conv discriminator applied to
real and generated images, their logits concatenated, two Adam optimizers stepped in one run): every cluster is
installed, and with every switch off each one's TF path computes what the user's graph computes.

Regressions (issue 34, the corpus' `dcgan.py`: 8 clusters installed, 2 declined):
- a convolution gradient's `ShapeN` reads the varying image and the variable's kernel; the cluster's TF path
  recomputes that `ShapeN` for each call's shapes, found no tensor of the kernel's (static) shape to read and
  declined the cluster ("the shape of '.../kernel/read:0' depends on the job's shape signature"): a static
  dimension is now a constant, a varying one a held tensor's (`recompute.rebuilt`);
- the gradient of `concat([real logits, fake logits])`: a `ShapeN` of two tensors the cluster does not hold,
  each from the inputs' dimensions now (the cluster was declined with a KeyError once the first was fixed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import assert_tf_paths_match, events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
NOISE, BATCH = 16, 8
SETTINGS = {"STITCHFLEET_WARMUP_STEPS": "5", "STITCHFLEET_BASELINE_STEPS": "1000", "STITCHFLEET_PROBE_STEPS": "0"}


def dcgan() -> tuple[Any, dict[str, Any], list[Any]]:
    graph = tf.Graph()
    with graph.as_default():
        V1.set_random_seed(0)
        noise = V1.placeholder(tf.float32, [None, NOISE], name="noise")
        real = V1.placeholder(tf.float32, [None, 12, 12, 1], name="real")
        disc_target = V1.placeholder(tf.int32, [None], name="disc_target")
        gen_target = V1.placeholder(tf.int32, [None], name="gen_target")

        def generator(x: Any) -> Any:
            with V1.variable_scope("Generator"):
                x = tf.nn.tanh(V1.layers.dense(x, 3 * 3 * 16))
                x = V1.layers.conv2d_transpose(tf.reshape(x, [-1, 3, 3, 16]), 8, 2, strides=2)
                return tf.nn.sigmoid(V1.layers.conv2d_transpose(x, 1, 2, strides=2))

        def discriminator(x: Any, reuse: bool = False) -> Any:
            with V1.variable_scope("Discriminator", reuse=reuse):
                x = V1.layers.average_pooling2d(tf.nn.tanh(V1.layers.conv2d(x, 8, 3)), 2, 2)
                x = tf.nn.tanh(V1.layers.dense(V1.layers.flatten(x), 32))
                return V1.layers.dense(x, 2)

        fake = generator(noise)
        logits = tf.concat([discriminator(real), discriminator(fake, reuse=True)], axis=0)
        stacked = discriminator(fake, reuse=True)
        entropy = tf.nn.sparse_softmax_cross_entropy_with_logits
        disc_loss = tf.reduce_mean(entropy(logits=logits, labels=disc_target))
        gen_loss = tf.reduce_mean(entropy(logits=stacked, labels=gen_target))
        scope = V1.GraphKeys.TRAINABLE_VARIABLES
        train_gen = V1.train.AdamOptimizer(1e-3).minimize(gen_loss, var_list=V1.get_collection(scope, "Generator"))
        train_disc = V1.train.AdamOptimizer(1e-3).minimize(
            disc_loss, var_list=V1.get_collection(scope, "Discriminator")
        )
    places = {"noise": noise, "real": real, "disc_target": disc_target, "gen_target": gen_target}
    return graph, places, [train_gen, train_disc, gen_loss, disc_loss]


def feeds(places: dict[str, Any], batch: int, rng: np.random.Generator) -> dict[Any, Any]:
    return {
        places["noise"]: rng.uniform(-1.0, 1.0, (batch, NOISE)).astype(np.float32),
        places["real"]: rng.uniform(0.0, 1.0, (batch, 12, 12, 1)).astype(np.float32),
        places["disc_target"]: np.concatenate([np.ones(batch), np.zeros(batch)]).astype(np.int32),
        places["gen_target"]: np.ones(batch, np.int32),
    }


def test_a_dcgans_clusters_install_and_their_tf_paths_compute_the_users_values(tmp_path: Path) -> None:
    graph, places, fetches = dcgan()
    hook, url = hooked(tmp_path, "dcgan", **SETTINGS)
    rng = np.random.default_rng(0)
    # one inter-op thread: the two optimizers race on shared variables in one run otherwise
    config = V1.ConfigProto(inter_op_parallelism_threads=1)
    creator = V1.train.ChiefSessionCreator(config=config)
    with graph.as_default(), V1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as session:
        for _ in range(3):
            session.run(fetches, feeds(places, BATCH, rng))
        assert hook.installed
        assert assert_tf_paths_match(session, hook, feeds(places, BATCH + 3, rng)) > 0
    refused = [e.detail for e in events(url, "compile_failure") if "graph rewrite failed" in e.reason]
    assert not refused, refused
