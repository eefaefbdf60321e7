"""The job's length bounds what the hook explores (issue 29): read from the StopAtStepHook beside it, a job too
short to afford its warmup and group probe is left as written before any compile, and says so in telemetry."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.session import job_length
from stitchfleet.plugin.session.hook import StitchHook
from tests.plugin.hook_harness import _feeds, events, make_settings

pytestmark = pytest.mark.tf


def _train(steps: int, hook: StitchHook, stop: Any) -> list[float]:
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        step_up = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
        feeds, losses = _feeds(graph), []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook, stop]) as session:
            while not session.should_stop() and len(losses) < steps:
                value, _, _ = session.run([loss, train_op, step_up], feeds)
                losses.append(float(value))
    return losses


def test_a_job_too_short_for_its_group_probe_compiles_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    # warmup 2 + the group's switched-on halves (2 rounds of 2) = 6 steps on the twin: over 5% of 60 planned steps
    current = make_settings(tmp_path, "short", STITCHFLEET_JOB_STEPS="0", STITCHFLEET_PROBE_STEPS="2")
    hook = StitchHook(current, backend="cpu", db_url=url)
    losses = _train(100, hook, tf.compat.v1.train.StopAtStepHook(last_step=60))
    assert len(losses) == 60 and np.all(np.isfinite(losses))
    assert hook.controller is None and not hook.installed and not hook.active
    [setup] = events(url, "setup", tmp_path / "state" / "spool")  # a skipped setup's rows wait in the spool
    assert setup.reason == "setup skipped: job too short"
    assert setup.detail.startswith("the job plans 60 steps; its warmup and group probe would run 6 of them")


def test_a_long_enough_job_is_set_up_and_its_controller_knows_the_steps_left(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    current = make_settings(tmp_path, "long", STITCHFLEET_JOB_STEPS="0", STITCHFLEET_PROBE_STEPS="2")
    hook = StitchHook(current, backend="cpu", db_url=url)
    _train(3, hook, tf.compat.v1.train.StopAtStepHook(num_steps=200))
    assert hook.controller is not None and hook.installed
    assert hook.controller.job_steps == 200  # num_steps from the session's start, the hook's step 0


def test_the_length_comes_from_the_settings_or_the_stop_hook() -> None:
    last = tf.compat.v1.train.StopAtStepHook(last_step=500)
    assert job_length.planned(0, last) == 500 and job_length.remaining(0, last, 120) == 380
    assert job_length.planned(0, tf.compat.v1.train.StopAtStepHook(num_steps=70)) == 70
    assert job_length.planned(900, last) == 900 and job_length.remaining(900, last, 120) == 900  # stated wins
    assert job_length.planned(0, None) is None and job_length.remaining(0, None, 5) is None
    hooks = [object(), last]
    mine = object()
    hooks.append(mine)
    assert job_length.stop_hook(mine) is last and job_length.stop_hook(object()) is None


def test_the_stop_hook_is_found_in_the_sessions_own_list_without_walking_every_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`begin` runs from the MonitoredSession's constructor: its `_hooks` holds the StopAtStepHook. Asking the garbage
    collector instead walked every object of the process in every job's `begin` (23-60 ms with TF imported)."""

    def everything(*objects: object) -> list[object]:
        raise AssertionError("gc.get_referrers walked every object")

    class Finder(tf.compat.v1.train.SessionRunHook):
        found: object = None

        def begin(self) -> None:
            self.found = job_length.stop_hook(self)

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        finder, stop = Finder(), tf.compat.v1.train.StopAtStepHook(num_steps=5)
        monkeypatch.setattr(gc, "get_referrers", everything)
        with tf.compat.v1.train.MonitoredSession(hooks=[finder, stop]):
            pass
        alone = Finder()
        with tf.compat.v1.train.MonitoredSession(hooks=[alone]):
            pass
    assert finder.found is stop
    assert alone.found is None  # the session's list holds no StopAtStepHook: none, without the walk either
