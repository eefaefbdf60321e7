"""A session whose graph trains nothing (tf.estimator's evaluate and predict, an eval script) is left as written
from `begin` on: no conversion, compile, telemetry or collective.

Regression: every evaluate() of an Estimator job got the hook, converted and compiled its whole graph and
then left every cluster off ("not on the training path"): 0.06-0.1 s on a small model, seconds on a large
graph, at every evaluation of a train-and-evaluate loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.setup import job_graph  # noqa: E402
from tests.plugin.hook_harness import hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1


def _model(train: bool) -> tuple[Any, list[Any], Any]:
    graph = tf.Graph()
    with graph.as_default():
        x = V1.placeholder(tf.float32, [8, 16], name="x")
        y = V1.placeholder(tf.int64, [8], name="y")
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(x)))
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.keras.layers.Dense(4)(h))
        )
        V1.train.get_or_create_global_step()
        if train:
            fetches = [loss, V1.train.AdamOptimizer(1e-3).minimize(loss, global_step=V1.train.get_global_step())]
        else:  # what an Estimator's evaluate builds: the loss and streaming metrics (local variables)
            accuracy, update = V1.metrics.accuracy(y, tf.argmax(h, -1))
            fetches = [loss, update, accuracy]
    return graph, fetches, (x, y)


@pytest.mark.parametrize("train", [False, True])
def test_only_a_graph_that_trains_pays_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train: bool) -> None:
    compiles: list[int] = []
    compiled = job_graph.compiled

    def counting(*args: Any, **kwargs: Any) -> Any:
        compiles.append(1)
        return compiled(*args, **kwargs)

    monkeypatch.setattr(job_graph, "compiled", counting)
    graph, fetches, (x, y) = _model(train)
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((8, 16)).astype(np.float32), y: rng.integers(0, 4, 8)}
    hook, _ = hooked(tmp_path, "eval" if not train else "train")
    with graph.as_default(), V1.train.MonitoredSession(hooks=[hook]) as session:
        for _ in range(6):
            session.run(fetches, feeds)
    if train:
        assert compiles and hook.ledger is not None
    else:
        assert not compiles and hook.ledger is None and hook.consensus is None and not hook.installed
