"""PluginCost: the plugin's own work no window's saving pays is the job's overhead, booked as its JobOverhead row.

Plain TF's step is 10 ms, a stitched step 8 ms, and the plugin works 1.5 ms around every step (the clock is the
test's): the stitched windows' savings pay their steps' share, the baseline steps' share is the overhead, and the
job's end records it through the normal telemetry path, where the report charges it beside the compile.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import pytest

from stitchfleet import settings
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.plugin_cost import PluginCost
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.control.step_contract import StepFigures
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.session import job_record
from stitchfleet.telemetry.savings import weekly_summary
from stitchfleet.telemetry.weeks import week_of

OWN = 0.0015  # the plugin's work around each step's timed run


def _job(tmp_path: Path, steps: int, *, off_at: int | None = None) -> tuple[Controller, str]:
    """One cluster, baseline blocks of 5 steps every 20, stitched between them until stitching goes off at `off_at`
    (then the steps run the user's graph as written: `Controller.done`)."""
    timing = Timing(
        warmup_steps=0, baseline_steps=5, rebaseline_every=20, window_steps=20, probe_steps=0, paired_steps=5
    )
    url = f"sqlite:///{tmp_path / 't.db'}"
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path), "STITCHFLEET_JOB_UID": "plugin-cost"})
    now = [0.0]
    found = [Cluster(0, f"{0:032x}", SimpleNamespace(bad=None), 3)]
    controller = Controller(found, timing, Ledger(current, 0, 1, url), 1, clock=lambda: now[0])
    for step in range(steps):
        if step == off_at:
            controller.stitching_off = "the group was not faster"
        plan = controller.step_plan(step)
        seconds = 0.008 if plan.on_twin else 0.010
        now[0] += OWN + seconds
        controller.step_done(plan, StepFigures(seconds, summed=plan.local))
    return controller, url


def test_the_overhead_is_the_own_work_on_steps_no_saving_pays(tmp_path: Path) -> None:
    controller, _ = _job(tmp_path, 65)  # baseline 0-4, stitched 5-19, ... stitched 45-59, baseline 60-64
    cost = PluginCost.of(controller)
    assert cost.own == pytest.approx(65 * OWN)
    assert cost.charged == pytest.approx(45 * OWN)  # the stitched steps': in their windows' savings
    assert cost.overhead == pytest.approx(20 * OWN)  # the baseline steps': paid by nobody but the overhead
    controller.ledger.close()


def test_the_jobs_end_books_it_and_the_report_charges_it(tmp_path: Path) -> None:
    """A job whose stitching went off after one stitched window (too few paired windows for an interval: nothing
    claimed): the report books minus its own cost, beside the compile it booked, in the task's device-seconds. Its
    steps once off (`done`) are the hook's quiet ones, which the own-work clock does not time (their cost: item 6)."""
    controller, url = _job(tmp_path, 40, off_at=25)
    controller.ledger.compiled(0.5)
    job_record.closed(controller.ledger, controller, None, None, (40, [], None))
    [task] = weekly_summary(url, week_of(dt.datetime.now(dt.UTC))).jobs
    assert task.gross_hours == 0.0 and task.speedup is None
    per_device = 3600.0 / task.devices
    assert task.overhead_hours * per_device == pytest.approx(10 * OWN)  # the two baseline blocks
    assert task.net_hours * per_device == pytest.approx(-(0.5 + 10 * OWN)) and task.net_hours < 0.0
