"""Threads sharing one MonitoredSession: the hook counts the training steps of one thread at a time, and a
run of another thread while a step is in flight is left as written (evaluated or trained as plain TF).

Regression: the hook kept its step flags in plain attributes. An eval run in another thread while a step
was in flight reset the step's flag, so the step's `after_run` was skipped (the controller had planned a
step it never heard of); a training run of another thread meanwhile took a plan of its own, and the step's
`after_run` found none (AssertionError: 'plugin error ... stitching reverts'). The tests interleave the
runs deterministically: a hook placed after the StitchHook runs the other thread's run inside the step,
between the StitchHook's `before_run` and `after_run`, as an eval thread does by chance.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.graph.training_steps import TrainingSteps  # noqa: E402
from tests.plugin.hook_harness import hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 10


class _OtherThread(V1.train.SessionRunHook):  # type: ignore[misc]
    """Inside every training step, runs `fetches` with `feeds` on the same session from another thread."""

    def __init__(self, train_op: Any, fetches: Any, feeds: dict[Any, Any]) -> None:
        self.train_op, self.fetches, self.feeds = train_op, fetches, feeds
        self.session: Any = None
        self.results: list[Any] = []
        self._busy = False  # the other thread's own run passes through this hook too

    def before_run(self, run_context: Any) -> None:
        fetches = run_context.original_args.fetches
        if self._busy or self.session is None or not isinstance(fetches, list) or self.train_op not in fetches:
            return
        self._busy = True
        thread = threading.Thread(target=lambda: self.results.append(self.session.run(self.fetches, self.feeds)))
        thread.start()
        thread.join(timeout=60)
        self._busy = False


def _graph() -> tuple[Any, Any, Any, Any, dict[Any, Any]]:
    graph = tf.Graph()
    with graph.as_default():
        V1.set_random_seed(0)
        x = V1.placeholder(tf.float32, [8, 16], name="x")
        y = V1.placeholder(tf.int64, [8], name="y")
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(x)))
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.keras.layers.Dense(4)(h)), name="loss"
        )
        train = V1.train.AdamOptimizer(1e-3).minimize(loss, global_step=V1.train.get_or_create_global_step())
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((8, 16)).astype(np.float32), y: rng.integers(0, 4, 8)}
    return graph, loss, train, x, feeds


@pytest.mark.parametrize("other", ["eval", "train"])
def test_a_run_of_another_thread_inside_a_step_leaves_the_step_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, other: str
) -> None:
    graph, loss, train, x, feeds = _graph()
    hook, _ = hooked(tmp_path, f"threads-{other}")
    with graph.as_default():
        fetches = [loss, train] if other == "train" else loss
        eval_feeds = {**feeds, x: feeds[x][::-1].copy()}  # an eval with other feeds
        inside = _OtherThread(train, fetches, feeds if other == "train" else eval_feeds)
        logged = caplog.at_level(logging.ERROR, logger="stitchfleet.plugin")
        with logged, V1.train.MonitoredSession(hooks=[hook, inside]) as session:
            inside.session = session
            for _ in range(STEPS):
                session.run([loss, train], feeds)
            final_step = session.run(V1.train.get_global_step())
    assert hook.installed and hook.active, "the hook stitched the graph"
    assert len(inside.results) == STEPS  # the other thread's runs ran, each inside a step
    assert hook.step == STEPS, "the main thread's steps, and only they, are counted"
    assert final_step == STEPS * (2 if other == "train" else 1)  # the other thread's training runs really trained
    assert "plugin error" not in caplog.text, caplog.text


def test_another_threads_run_does_not_change_the_walk_a_thread_reads() -> None:
    graph, loss, train, _, _ = _graph()
    steps = TrainingSteps(graph)
    assert steps.updates_variables([loss, train])
    walked = steps.reached
    thread = threading.Thread(target=lambda: steps.updates_variables(loss))  # an eval thread's run
    thread.start()
    thread.join(timeout=60)
    assert steps.reached == walked and train.name in steps.reached
    assert {op.name for op in steps.fetched} == {train.name, loss.op.name}
