"""The hook's per-step cost (issue 29): no file I/O on the training step's thread between windows.

Regression: every telemetry window's close numbered the window in the rank's record on the step's thread (file
lock, read, atomic replace: 6-8 ms a window on the loaded CI disk, ~300 us a step amortised over 20-step
windows). It is done on the record's writer thread now; the windows' rows and numbers are unchanged.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.control.schedule import STITCHED
from tests.plugin.hook_harness import _feeds, hooked

pytestmark = pytest.mark.tf
WATCHED: dict[str, Any] = {"thread": None, "under": None, "seen": [], "added": False}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Records file events under the watched folder made on the watched thread (audit hooks stay for the process:
    this one does nothing unless a test sets the thread)."""
    if WATCHED["thread"] is not threading.current_thread() or event not in ("open", "os.rename", "fcntl.flock"):
        return
    if any(isinstance(a, str | Path) and str(a).startswith(WATCHED["under"]) for a in args):
        WATCHED["seen"].append((event, str(args[0])))


def test_windows_close_without_file_io_on_the_steps_thread(tmp_path: Path) -> None:
    if not WATCHED["added"]:  # once per process: an audit hook cannot be removed
        sys.addaudithook(_audit)
        WATCHED["added"] = True
    hook, url = hooked(tmp_path, "step-io")
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(12):  # warmup, baseline, the first stitched steps (setup is booked in these)
                session.run([loss, train_op], feeds)
            assert hook.controller is not None and hook.controller.mode(hook.step) == STITCHED
            closed = hook.controller.windows.index
            WATCHED.update(thread=threading.current_thread(), under=str(tmp_path / "state"), seen=[])
            try:
                for _ in range(20):  # four 5-step windows close
                    session.run([loss, train_op], feeds)
            finally:
                WATCHED["thread"] = None
            assert hook.controller.windows.index - closed >= 3
    assert WATCHED["seen"] == []  # before: a lock, a read, a write and a replace of the record per window
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        numbers = [n for (n,) in db.execute("SELECT window_index FROM step_windows ORDER BY window_index")]
    assert numbers == list(range(len(numbers))) and len(numbers) >= closed + 3  # every window, numbered as before
