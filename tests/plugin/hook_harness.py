"""Shared by the hook tests: train the small BERT encoder with and without a StitchHook.

Input: settings overrides, an optional Fault, a database URL. Output: `Run` with the
losses per step, the hook (backend calls, controller state) and the events in the database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings
from stitchfleet.demo import models
from stitchfleet.plugin.control.schedule import STITCHED
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.session.hook import StitchHook
from tests.plugin.recorded_events import events  # noqa: F401 (the hook tests take it from here)
from tests.shared_cache import kernel_cache

FAST = {
    "STITCHFLEET_WARMUP_STEPS": "2",
    "STITCHFLEET_BASELINE_STEPS": "3",
    "STITCHFLEET_WINDOW_STEPS": "5",
    "STITCHFLEET_CHECK_EVERY": "4",
    "STITCHFLEET_CHECK_FIRST": "2",
    "STITCHFLEET_FLUSH_SECONDS": "10",
    "STITCHFLEET_PROBE_STEPS": "0",  # the guard's flow with every cluster on; probing is tested apart
    "STITCHFLEET_PROBE_GROUP_FACTOR": "1",  # probe tests count one group round per probe round
    "STITCHFLEET_PROBE_MIN_STEPS": "1",  # their pairs time 1-3 steps a half (2 probe steps, 1 round); not a default
    "STITCHFLEET_JOB_STEPS": "100000",  # a long job: every probe fits PROBE_SHARE (test_hook_job_length: shorter)
    "STITCHFLEET_SETTLE_STEPS": "0",  # stitched steps from the first block on; the settle block is tested apart
}


@dataclass
class Run:
    losses: list[float]
    hook: StitchHook | None


def make_settings(tmp: Path, uid: str, **extra: str) -> settings.Settings:
    env = {**FAST, "STITCHFLEET_STATE_DIR": str(tmp / "state"), "STITCHFLEET_JOB_UID": uid}
    env["STITCHFLEET_CACHE_DIR"] = str(kernel_cache())
    env.update(extra)
    return settings.load(env)


def _feeds(graph: Any) -> dict[Any, Any]:
    rng = np.random.default_rng(0)
    feeds = {}
    for name in ("input:0", "target:0"):
        tensor = graph.get_tensor_by_name(name)
        feeds[tensor] = rng.standard_normal(tensor.shape.as_list()).astype(np.float32)
    feeds[graph.get_tensor_by_name("attention_mask:0")] = np.ones((2, 8), np.float32)
    return feeds


@contextmanager
def stitched_steps(hook: StitchHook) -> Iterator[Callable[[], Any]]:
    """The small BERT encoder in a MonitoredSession under `hook`, past its warmup, baseline and the stitched phase's
    first checks: yields a step (runs the loss and the train op, returns what the run returned)."""
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        fetches = [graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")]
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(12):
                session.run(fetches, feeds)
            assert hook.controller is not None and hook.controller.mode(hook.step) == STITCHED
            yield lambda: session.run(fetches, feeds)


def train(steps: int, hook: StitchHook | None, before: list[Any] | None = None) -> Run:
    """`before`: hooks listed ahead of `hook`, so their before_run and after_run wrap its timed interval."""
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        losses = []
        with tf.compat.v1.train.MonitoredSession(hooks=[*(before or []), *([hook] if hook else [])]) as session:
            for _ in range(steps):
                value, _ = session.run([loss, train_op], feeds)
                losses.append(float(value))
    return Run(losses, hook)


def hooked(tmp: Path, uid: str, fault: Fault | None = None, **extra: str) -> tuple[StitchHook, str]:
    url = f"sqlite:///{tmp / 'telemetry.db'}"
    return StitchHook(make_settings(tmp, uid, **extra), backend="cpu", fault=fault, db_url=url), url


def assert_tf_paths_match(session: Any, hook: StitchHook, feeds: dict[Any, Any]) -> int:
    """Runs the twin once on `session`'s raw session with every switch off (the default): every installed
    cluster's TF path (the dispatch op's fallback function) must give what the user's own graph computes in the
    same run, from the same feeds and the same draws of shared random ops, to float32 rounding (grappler and oneDNN
    rewrite the user's graph, not a function's body alike: a Keras attention's softmax differed by 3e-8; a wrong
    tensor read differs by the values themselves). Feed a shape signature other than the setup's: that is where a
    shape baked into the TF path would show. Returns the outputs compared."""
    graph = tf.compat.v1.get_default_graph()
    pairs = []
    for _, installed in hook.installed:
        for original, switched in zip(installed.original, installed.switched, strict=True):
            pairs.append((graph.get_tensor_by_name(original.name.removeprefix("stitchfleet_twin/")), switched))
    assert hook.diverter is not None
    hook.diverter.armed = True
    values = session._tf_sess().run([t for pair in pairs for t in pair], feeds)
    for k, (user, _) in enumerate(pairs):
        mine, theirs = values[2 * k], values[2 * k + 1]
        assert mine.shape == theirs.shape, (user.name, mine.shape, theirs.shape)
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6, err_msg=f"{user.name} against its TF path")
    return len(pairs)
