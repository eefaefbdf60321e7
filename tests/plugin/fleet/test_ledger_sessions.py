"""Several sessions of one job's rank in one process (tf.estimator's train calls, a script training in
phases), each with a hook of its own: every training step lands in a window, and the job is charged the
setup of every session.

Regression: each session's windows counted from 0 and telemetry keys a window by (job, rank, index), so
the second session's windows replaced the first's (an Estimator job that trained 60 + 60 steps recorded
60); and the job kept the largest session's setup seconds instead of their sum."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.plugin.hook_harness import hooked, train

pytestmark = pytest.mark.tf
STEPS = (14, 9)


def _job(url: str) -> tuple[dict[str, int], int, float]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        modes = dict(connection.execute("SELECT mode, SUM(iterations) FROM step_windows GROUP BY mode").fetchall())
        (windows,) = connection.execute("SELECT COUNT(*) FROM step_windows").fetchone()
        (seconds,) = connection.execute("SELECT compile_seconds FROM jobs").fetchone()
    return modes, windows, float(seconds)


def test_every_session_of_a_rank_keeps_its_windows_and_its_setup(tmp_path: Path) -> None:
    first, url = hooked(tmp_path, "phases")
    train(STEPS[0], first)
    modes, first_windows, first_setup = _job(url)
    assert sum(modes.values()) == STEPS[0] and first_setup > 0
    second, same_url = hooked(tmp_path, "phases")  # the same job and rank, a new session and hook
    assert same_url == url
    train(STEPS[1], second)
    modes, windows, setup = _job(url)
    assert sum(modes.values()) == sum(STEPS), modes  # before: the second session's windows replaced the first's
    assert windows > first_windows
    assert setup > first_setup  # before: the larger of the two sessions' setups, not their sum
