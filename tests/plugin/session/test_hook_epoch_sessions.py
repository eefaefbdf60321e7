"""A script that opens a new MonitoredSession per epoch on the same graph trains as plain TF in every epoch:
the first session stitches the graph, the later ones leave it as written, without an error or a setup.

Regression: TF unfinalizes a graph when its MonitoredSession closes, so the next session's hook set up the
graph again, now holding the first session's stitched copy: it clustered the copy itself and its twin build
raised (KeyError 'stitchfleet_twin/stitchfleet_twin/...'), logged as 'stitching is off for this job' with a
'plugin setup failed' event, after paying the conversion and compiles, at every epoch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
EPOCHS, STEPS = 3, 6


def test_a_session_per_epoch_on_one_graph(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    graph = tf.Graph()
    with graph.as_default():
        V1.set_random_seed(0)
        x = V1.placeholder(tf.float32, [8, 16], name="x")
        y = V1.placeholder(tf.int64, [8], name="y")
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(x)))
        logits = tf.keras.layers.Dense(4)(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        step = V1.train.get_or_create_global_step()
        train = V1.train.AdamOptimizer(1e-3).minimize(loss, global_step=step)
        rng = np.random.default_rng(0)
        feeds = {x: rng.standard_normal((8, 16)).astype(np.float32), y: rng.integers(0, 4, 8)}
        hooks, urls, steps = [], [], []
        with caplog.at_level(logging.WARNING, logger="stitchfleet.plugin"):
            for epoch in range(EPOCHS):
                hook, url = hooked(tmp_path / str(epoch), "epochs")  # as the boot shim gives each session its own
                hooks.append(hook)
                urls.append(url)
                # the variables live in the session: each epoch starts from initial values, as in plain TF
                with V1.train.MonitoredSession(hooks=[hook]) as session:
                    for _ in range(STEPS):
                        session.run([loss, train], feeds)
                    steps.append(session.run(step))
    assert steps == [STEPS] * EPOCHS
    assert hooks[0].installed and hooks[0].step == STEPS, "the first session stitched the graph"
    assert not events(urls[0], "compile_failure")
    for hook in hooks[1:]:
        assert not hook.active and hook.step == 0
        assert hook.ledger is None and not hook.installed, "no setup: the graph is left as written"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert "stitched by an earlier session" in caplog.text
