"""A float16 model trains under the hook as it does without it (its variables, Keras layers in float16).

Regression: Keras' LayerNormalization casts a float16 input to float32, so the cluster holding the cast
and the moments has a float16 input of the same shape as its float32 interior. A gradient's `Shape` read
of that interior (under a `None` batch, a shape that varies) was rerouted to the float16 input: the
rewrite made a graph TF refused when the session was created, and the job failed before its first step
("Input 0 of node stitchfleet_twin/gradients/.../variance_grad/Shape was passed half ... expected float").
Then such a cluster was left to TF (a `graph rewrite failed` event said why); since 2026-11-24 that `Shape`'s value
is computed from the cluster inputs' dimensions, whatever their dtype (`rewrite.LiveReader`), and it is stitched too.

Regression: with a cold cache the translation check refused the float16 layer-norm gradient cluster
(reshape.115: 0.0182 from TF's ops, 0.0124 allowed): TF's CPU kernels sum float16 in float16 (four interleaved
float16 accumulators, bit for bit), the IR's float16 evaluation sums in float32, and the check took the latter
as TF's rounding. Now float16 outputs' TF rounding is sized from the IR in float32 (guard/translation.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 12


def _train(hook: Any) -> list[float]:
    graph = tf.Graph()
    with graph.as_default():
        V1.set_random_seed(0)
        x = V1.placeholder(tf.float32, [None, 16], name="x")  # a None batch: the shapes the gradients read vary
        y = V1.placeholder(tf.int64, [None], name="y")
        init = V1.glorot_uniform_initializer(seed=1)
        h = tf.keras.layers.Dense(32, dtype=tf.float16, kernel_initializer=init)(tf.cast(x, tf.float16))
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization(dtype=tf.float16)(h))
        logits = tf.keras.layers.Dense(4, dtype=tf.float16, kernel_initializer=init)(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        step = V1.train.get_or_create_global_step()
        train = V1.train.GradientDescentOptimizer(tf.constant(0.1, tf.float16)).minimize(loss, global_step=step)
        rng = np.random.default_rng(0)
        feeds = {x: rng.standard_normal((8, 16)).astype(np.float32), y: rng.integers(0, 4, 8)}
        with V1.train.MonitoredSession(hooks=[hook] if hook is not None else []) as session:
            return [float(session.run([loss, train], feeds)[0]) for _ in range(STEPS)]


def test_a_float16_model_trains_as_plain_tf(tmp_path: Path) -> None:
    # a cold kernel cache: no translation check passed earlier stands in for this run's
    hook, url = hooked(tmp_path, "float16", STITCHFLEET_CACHE_DIR=str(tmp_path / "cache"))
    stitched, plain = _train(hook), _train(None)
    assert len(stitched) == STEPS
    np.testing.assert_allclose(stitched, plain, rtol=5e-3)  # float16 rounding, the guard keeps them near
    refused = [e.detail for e in events(url, "compile_failure") if "graph rewrite failed" in e.reason]
    assert hook.installed and not refused, refused  # the float16-to-float32 shape read's cluster included
