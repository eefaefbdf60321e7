"""Holdout runs (issue 29, session 53): one run in every STITCHFLEET_HOLDOUT_EVERY of a single-rank job whose node
record says its setup pays runs as written and timed, its steps booked as baseline windows for the report's held-out
check (plain TF's step in a process of its own). Its training is plain TF's bit for bit, and the record's figure stays
as it was; with N 0, without a figure weighed, or in a Horovod job, no run is held out."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.demo import models
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.session import job_length
from stitchfleet.plugin.session.hook import QUIET_BATCH, StitchHook
from stitchfleet.plugin.setup import payback, setup_record
from stitchfleet.plugin.setup.setup_record import CacheState, Measured
from stitchfleet.telemetry.kinds import HOLDOUT_REASON
from tests.plugin.hook_harness import _feeds, events, make_settings
from tests.plugin.setup.test_setup_record import _kernels

pytestmark = pytest.mark.tf
STEPS = QUIET_BATCH + 5  # a batch booked while the job trains, the rest at its end
PLANNED = 100_000  # the StopAtStepHook's: with the record's gain and plain step, a setup pays
WINDOW = 5  # hook_harness.FAST's STITCHFLEET_WINDOW_STEPS
# the node's record: a clear steady gain, the step it was measured at (no one states a step time)
GAIN = Measured(gain=0.3, steps=400, per_run=0.5, noise=0.01, plain_step=0.004)


class _Key(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """The job's record key as the StitchHook in its place computes it at `begin`."""

    def __init__(self, current: settings_module.Settings) -> None:
        self.current, self.key = current, ""

    def begin(self) -> None:
        self.key = setup_record.record_key(tf.compat.v1.get_default_graph(), "cpu", self.current)


def _train(hooks: list[Any]) -> list[np.ndarray[Any, Any]]:
    """STEPS training steps of the small BERT encoder under `hooks` (a StopAtStepHook of PLANNED steps after them);
    its trained variables, read on the raw session (no hook sees that run)."""
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        step_up = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
        feeds, variables = _feeds(graph), tf.compat.v1.trainable_variables()
        stop = tf.compat.v1.train.StopAtStepHook(num_steps=PLANNED)
        with tf.compat.v1.train.MonitoredSession(hooks=[*hooks, stop]) as session:
            for _ in range(STEPS):
                session.run([loss, train_op, step_up], feeds)
            return list(session._tf_sess().run(variables))


def _windows(url: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        query = (
            "SELECT mode, first_step, last_step, iterations, step_seconds_sum, baseline_step_seconds, saved_seconds"
            " FROM step_windows ORDER BY window_index"
        )
        return list(connection.execute(query))


def test_one_run_in_every_two_that_would_set_up_runs_as_written_and_timed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    def current(run: str) -> settings_module.Settings:
        return make_settings(
            tmp_path / run,
            f"holdout-{run}",
            STITCHFLEET_CACHE_DIR=str(cache),
            STITCHFLEET_BRIDGE="python",
            STITCHFLEET_JOB_STEPS="0",  # the StopAtStepHook's
            STITCHFLEET_HOLDOUT_EVERY="2",
            STITCHFLEET_SLOWDOWN_MARGIN="100",  # a loaded machine's noise must not revert a run into a new figure
        )

    finder = _Key(current("key"))
    _train([finder])
    assert setup_record.write(cache, finder.key, "cpu", _kernels(cache, ["held.so"]))
    assert setup_record.remember(cache, finder.key, "cpu", GAIN)
    runs: list[tuple[StitchHook, str, list[np.ndarray[Any, Any]], Measured | None]] = []
    for run in ("first", "second", "third"):
        url = f"sqlite:///{tmp_path / run}.db"
        hook = StitchHook(current(run), backend="cpu", db_url=url)
        trained = _train([hook])
        runs.append((hook, url, trained, setup_record.recall(cache, finder.key, "cpu", op=True).measured))
    (first, _, stitched, after_first), (held, url, trained, after_held), (third, _, _, after_third) = runs

    assert first.setup is not None and first.setup.recorded == finder.key and first.installed
    assert not first.length.held_out and after_first is not None and after_first.setups == 1
    assert held.length.held_out and held.setup is None and held.controller is None and not held.installed
    assert held.step == STEPS and after_held is not None and after_held.setups == 0
    assert third.setup is not None and third.installed and not third.length.held_out
    assert after_third is not None and after_third.setups == 1
    for measured in (after_first, after_held, after_third):  # the figure the record holds stays as written
        assert replace(measured, setups=0) == GAIN

    [setup] = events(url, "setup", tmp_path / "second" / "state" / "spool")  # a skipped run's rows wait there
    assert (setup.reason, setup.detail) == (HOLDOUT_REASON, held.length.skipped)
    assert setup.detail.startswith("run 2 of every 2 that would set up on this node's record runs as written")
    windows = _windows(url)
    assert [w[0] for w in windows] == ["baseline"] * len(windows)
    assert [w[3] for w in windows] == [WINDOW] * (STEPS // WINDOW) + [STEPS % WINDOW]  # the last one partial
    assert sum(w[3] for w in windows) == STEPS and windows[0][1] == 0 and windows[-1][2] == STEPS - 1
    assert all(w[4] > 0 and w[5] is None and w[6] == 0.0 for w in windows)

    plain = _train([])  # plain TF, no hook: the same graph, seed, feeds and steps
    assert len(plain) == len(trained) > 0
    for mine, theirs in zip(trained, plain, strict=True):
        assert mine.tobytes() == theirs.tobytes()
    # the comparison can tell: the first run's stitched steps rounded otherwise than plain TF's
    assert any(mine.tobytes() != theirs.tobytes() for mine, theirs in zip(stitched, plain, strict=True))


class _Told:
    """The ledger `JobLength.short` writes to: what it was told."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def event(self, kind: str, step: int | None, fingerprint: str | None, reason: str, **figures: object) -> None:
        self.said.append(reason)

    def setup_skipped(self, label: str, why: str) -> None:
        self.said.append(label)

    def spool_meanwhile(self) -> None:
        pass


def _decide(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    measured: Measured | None,
    every: int,
    *,
    ranks: int = 1,
    uid: str = "",
) -> tuple[bool, list[str], list[bool]]:
    """`JobLength.short` on a job of PLANNED steps whose node record holds `measured` (None: a record without a
    figure): whether it held the run out, what it told the ledger, and the `held_out` it counted in the record."""
    monkeypatch.setattr(setup_record, "state", lambda *_: CacheState(4, 4, True, "warm", measured, "key"))
    counted: list[bool] = []
    monkeypatch.setattr(setup_record, "tally", lambda *_, held_out=False: counted.append(held_out) or True)
    current = settings_module.load(
        {
            "STITCHFLEET_STATE_DIR": str(tmp_path),
            "STITCHFLEET_JOB_STEPS": str(PLANNED),
            "STITCHFLEET_HOLDOUT_EVERY": str(every),
            **({"STITCHFLEET_JOB_UID": uid} if uid else {}),
        }
    )
    length, told = job_length.JobLength(current), _Told()
    with tf.Graph().as_default():
        length.short(object(), cast(Ledger, told), "cpu", ranks)
    return length.held_out, told.said, counted


def test_a_holdout_comes_once_every_n_runs_set_up_on_a_figure_and_only_then(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    turn = replace(GAIN, setups=1)  # one run set up on the figure since the last holdout
    assert _decide(monkeypatch, tmp_path, turn, every=2) == (True, [HOLDOUT_REASON], [True])
    assert _decide(monkeypatch, tmp_path, GAIN, every=2) == (False, ["setup affordable"], [False])  # its first run
    assert _decide(monkeypatch, tmp_path, replace(GAIN, setups=40), every=0) == (False, ["setup affordable"], [False])
    assert _decide(monkeypatch, tmp_path, GAIN, every=1)[0]  # every run that would set up
    # a Horovod job: its ranks' nodes hold different records, and every rank must decide alike
    assert _decide(monkeypatch, tmp_path, turn, every=2, ranks=2) == (False, ["setup affordable"], [False])
    # no figure on the node: its run sets up and nothing is counted
    assert _decide(monkeypatch, tmp_path, None, every=1) == (False, ["setup affordable"], [])
    # a figure that says no: the run skips on it, never as a holdout
    lost = replace(GAIN, gain=-0.05, setups=1)
    assert _decide(monkeypatch, tmp_path, lost, every=2) == (False, ["setup skipped: measured not to pay"], [False])
    # a run exploring again after RETRY_AFTER skips weighed no figure: it explores
    retry = replace(turn, skips=payback.RETRY_AFTER)
    assert _decide(monkeypatch, tmp_path, retry, every=2) == (False, ["setup affordable"], [False])


def test_a_runs_later_sessions_follow_its_first_and_are_not_counted_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An Estimator's `train` per epoch: one run (one STITCHFLEET_JOB_UID, one task in the report), a session each.
    A holdout task with stitched windows of its other sessions would hand the held-out check no plain step."""
    monkeypatch.setattr(job_length, "RUN_HOLDOUTS", {})
    turn = replace(GAIN, setups=1)
    assert _decide(monkeypatch, tmp_path, turn, every=2, uid="run-a") == (True, [HOLDOUT_REASON], [True])
    # its next session, whose record the holdout reset: held out too, and the record is not counted again
    assert _decide(monkeypatch, tmp_path, GAIN, every=2, uid="run-a") == (True, [HOLDOUT_REASON], [])
    # a run whose first session sets up: its later session at the holdout's turn sets up too
    assert _decide(monkeypatch, tmp_path, GAIN, every=2, uid="run-b") == (False, ["setup affordable"], [False])
    assert _decide(monkeypatch, tmp_path, turn, every=2, uid="run-b") == (False, ["setup affordable"], [])
    # without a job uid every session is a run of its own (its task too), as before
    assert _decide(monkeypatch, tmp_path, turn, every=2) == (True, [HOLDOUT_REASON], [True])
