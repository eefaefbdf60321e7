"""A session created inside the user's name or variable scope is stitched like one created at the top level.

Regression: the hook's `begin` runs where the session is created, so what it added to the graph went under
the user's scope: the stitched copy was imported as 'model/stitchfleet_twin/...' and looked up as
'stitchfleet_twin/...' (KeyError, 'plugin setup failed': the job ran, never stitched). Scripts that build
their model and open their session in one `with tf.compat.v1.variable_scope("model"):` block do this.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 6


@pytest.mark.parametrize("scope", ["name_scope", "variable_scope"])
def test_a_session_created_in_a_scope_is_stitched(tmp_path: Path, scope: str) -> None:
    graph = tf.Graph()
    hook, url = hooked(tmp_path, f"scope-{scope}")
    enclosing = tf.name_scope if scope == "name_scope" else V1.variable_scope
    with graph.as_default(), enclosing("model"):
        x = V1.placeholder(tf.float32, [8, 16], name="x")
        y = V1.placeholder(tf.int64, [8], name="y")
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(x)))
        logits = tf.keras.layers.Dense(4)(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train = V1.train.AdamOptimizer(1e-3).minimize(loss, global_step=V1.train.get_or_create_global_step())
        rng = np.random.default_rng(0)
        feeds = {x: rng.standard_normal((8, 16)).astype(np.float32), y: rng.integers(0, 4, 8)}
        with V1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(STEPS):
                session.run([loss, train], feeds)
    assert not [e.reason for e in events(url, "compile_failure") if "plugin setup failed" in e.reason]
    assert hook.installed and hook.active and hook.step == STEPS
