"""The hook's per-step work once stitching is off for the job (issue 29 item 6), counted, never timed.

Once `Controller.done` (the job reverted, or no cluster kept), a step runs the user's graph as written: the hook
adds no fetch or feed, takes no controller decision (the steps are queued and booked in one `quiet_steps` call a
batch, with the telemetry windows) and does not walk the step's fetches again. Before: `step_done`, `timed`, `done`
and the fetch walk ran every step; then one controller call a step (session 43: a batch).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.session.hook import QUIET_BATCH, StitchHook
from tests.plugin.hook_harness import _feeds, hooked

pytestmark = pytest.mark.tf
DECISIONS = {"step_plan", "step_done", "decide", "local", "switches", "judged", "timed", "done", "checks"}
BUDGET = 12  # Python calls inside the plugin per quiet step, window closes included (~9; was 13, 25, 55 before)


@contextlib.contextmanager
def _reverted(tmp_path: Path, uid: str) -> Iterator[tuple[StitchHook, str, Any, tf.Tensor, tf.Operation, Any]]:
    """A demo-model job stitched for 8 steps, then reverted by its guard's own path (its next step is quiet):
    the hook, its database URL, the session, the loss, the train op and the feeds."""
    hook, url = hooked(tmp_path, uid)
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(8):  # warmup, baseline, stitched steps
                session.run([loss, train_op], feeds)
            assert hook.controller is not None and not hook.controller.done
            assert "run" in vars(session._tf_sess())  # the twin's diverter wraps the raw session's run while stitching
            hook.controller._revert_job(hook.step, "slowdown", "reverted by the test")
            yield hook, url, session, loss, train_op, feeds


def test_quiet_steps_add_nothing_and_decide_nothing(tmp_path: Path) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    returned: list[object] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        path = frame.f_code.co_filename
        if "stitchfleet" not in path or "/tests/" in path:
            return
        if event == "call":
            calls[(Path(path).stem, frame.f_code.co_name)] += 1
        elif event == "return" and frame.f_code.co_name == "before_run" and path.endswith("hook.py"):
            returned.append(arg)

    with _reverted(tmp_path, "quiet-steps") as (hook, url, session, loss, train_op, feeds):
        raw = session._tf_sess()
        session.run([loss, train_op], feeds)  # the first step that sees it
        assert "run" not in vars(raw)  # stitching is over: the session's own run, no wrapper per step
        steps, first = QUIET_BATCH + 8, hook.step  # one batch booked, a few steps left queued
        sys.setprofile(profile)
        try:
            for _ in range(steps):
                session.run([loss, train_op], feeds)
        finally:
            sys.setprofile(None)
        # another thread is booking a batch when the session ends: `end` waits for it, then books the rest
        # (it gave up before, and the steps queued meanwhile were never booked)
        hook._booking.acquire()
        ending = hook.end

        def end_while_booking(session: tf.compat.v1.Session) -> None:
            threading.Timer(0.3, hook._booking.release).start()  # the other booking ends while `end` runs
            ending(session)

        hook.end = end_while_booking  # type: ignore[method-assign]
    assert hook.step == first + steps  # every step still counted and timed
    assert returned == [None] * steps  # no fetch, no feed added
    control = {name for (module, name) in calls if module == "controller"}
    assert control & DECISIONS == set(), control
    assert calls[("controller", "quiet_steps")] == 1  # one call for the batch, none per step
    assert calls[("training_steps", "fetched_ops")] == 0  # the same fetches: not walked again
    assert calls[("training_steps", "updates_variables")] == 0  # the very objects of the last training run (s45)
    assert sum(calls.values()) <= BUDGET * steps, calls.most_common(12)
    # the steps still queued at the session's end are booked by the hook's `end`: every step is in the windows
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        (counted,) = connection.execute("SELECT SUM(iterations) FROM step_windows").fetchone()
    assert counted == hook.step


def test_a_quiet_step_known_by_its_objects_never_by_a_container_whose_contents_change(tmp_path: Path) -> None:
    # The quiet path knows a training run again by the identity of its fetched tensors and ops; a list or dict
    # among them may hold a train op in one run and not in the next, so it is asked each time
    with _reverted(tmp_path, "quiet-containers") as (hook, _, session, loss, train_op, feeds):
        session.run([loss, train_op], feeds)  # the first quiet step
        box: list[object] = [train_op]
        fetches = {"loss": loss, "step": box}
        first = hook.step
        session.run([loss, box], feeds)  # a training step: counted
        box[0] = loss  # the same list, no train op in it now
        session.run([loss, box], feeds)  # not a step
        box[0] = train_op
        session.run(fetches, feeds)  # a step
        box[0] = loss
        session.run(fetches, feeds)  # the same dict, no train op in it now: not a step
        assert hook.step == first + 2
        session.run([loss, train_op], feeds)
        session.run([loss, train_op], feeds)  # the known objects: a step without asking again
        assert hook.step == first + 4
