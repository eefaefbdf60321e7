"""Random ops draw once per step whichever path runs: seeded dropout at learning rate 0 loses as plain TF.

Regression (issue 30 item 1): the stitched twin copied every op downstream of a cluster, stateful random
ops included. A TF1 random op keeps its generator in its kernel, so the seeded copy replayed the user
graph's stream from its start while the original's stream stood still: every Keras/TF1 model with
dropout trained on other masks under the plugin (loss off by 100% at lr 0). With the learning rate at 0
a step's loss depends only on its draws, so each step's loss must equal plain TF's, up to the stitched
kernels' rounding (the guard's rule) on steps with clusters on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 40
SETTLE_S = 300  # the longest a test waits for background compiles (a cold kernel cache compiles C)
ROUNDING = 1e-5  # relative: float32 kernels against TF's ops; a mask of another step moves the loss ~100%

Layer = Callable[[Any], Any]
DROPOUTS: dict[str, Layer] = {
    "tf.nn.dropout": lambda h: tf.nn.dropout(h, rate=0.5, seed=7),
    "tf.layers.dropout": lambda h: V1.layers.dropout(h, rate=0.4, training=True),
    "keras.Dropout": lambda h: tf.keras.layers.Dropout(0.3, seed=5)(h, training=True),
    "tf.random.uniform (op seed)": lambda h: h * tf.random.uniform(tf.shape(h), 0.5, 1.5, seed=11),
    "tf.random.normal (graph seed)": lambda h: h + 0.1 * tf.random.normal(tf.shape(h)),
    "tf.random.truncated_normal": lambda h: h + 0.1 * V1.truncated_normal(tf.shape(h), seed=3),
    "tf.random.categorical": lambda h: (
        h + tf.cast(tf.random.categorical(h, 1, seed=2), tf.float32)[:, :1] * 0.01
    ),  # reads the cluster's values
}


def _losses(draws: list[Layer], resource: bool, hook: Any, batch: int | None) -> list[float]:
    graph = tf.Graph()
    with graph.as_default():
        V1.set_random_seed(0)
        x = V1.placeholder(tf.float32, [batch, 16], name="x")
        init = V1.random_normal_initializer(seed=1)
        h = x
        for i, draw in enumerate(draws):
            w = V1.get_variable(f"w{i}", [16, 16], initializer=init, use_resource=resource)
            h = draw(tf.nn.gelu(tf.matmul(h, w) * 0.5 + 0.1))  # the gelu and its gradient: stitched clusters
        loss = tf.reduce_mean(tf.square(h))
        train = V1.train.GradientDescentOptimizer(0.0).minimize(loss)
        feeds = {x: np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)}
        losses = []
        with V1.train.MonitoredSession(hooks=[hook] if hook is not None else []) as session:
            for step in range(STEPS):
                losses.append(float(session.run([loss, train], feeds)[0]))
                if step == 6 and hook is not None and hook.signatures is not None:
                    assert hook.signatures.wait(SETTLE_S)  # an unknown batch: its kernels compile in the background
        return losses


def _stitched_calls(hook: Any) -> int:
    calls = sum(c.kernel.calls for c, _ in hook.installed)
    if hook.signatures is not None:
        calls += sum(n for key in hook.signatures.bound() for n in hook.signatures.calls(key).values())
    return int(calls)


def _assert_same_draws(tmp: Path, draws: list[Layer], resource: bool, batch: int | None = None) -> None:
    plain = _losses(draws, resource, None, batch)
    hook, url = hooked(tmp, f"random-streams-{resource}-{batch}", STITCHFLEET_PROBE_STEPS="0")
    stitched = _losses(draws, resource, hook, batch)
    assert hook.installed and _stitched_calls(hook) > 0, "stitched steps ran"
    assert hook.diverter is not None and hook.diverter.failure is None
    assert not [e.detail for e in events(url, "revert")]
    moved = [
        (step, a, b) for step, (a, b) in enumerate(zip(plain, stitched, strict=True)) if abs(a - b) > ROUNDING * abs(a)
    ]
    assert not moved, f"steps drew other values than plain TF: {moved[:5]}"


@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
def test_every_random_op_draws_as_plain_tf_with_an_unknown_batch(tmp_path: Path, resource: bool) -> None:
    _assert_same_draws(tmp_path, list(DROPOUTS.values()), resource)


@pytest.mark.sweep  # 28 cases, about a minute: the test above is its fast slice
@pytest.mark.parametrize("batch", [None, 8], ids=["unknown-batch", "static-batch"])
@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
@pytest.mark.parametrize("name", sorted(DROPOUTS))
def test_each_random_op_draws_as_plain_tf(tmp_path: Path, name: str, resource: bool, batch: int | None) -> None:
    _assert_same_draws(tmp_path, [DROPOUTS[name], lambda h: h], resource, batch)
