"""The hook's two calls per step (`Controller.step_plan`, `Controller.step_done`), without TF."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from types import FrameType, SimpleNamespace

import pytest

from stitchfleet import settings
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import EXTRA, Controller
from stitchfleet.plugin.control.decision_figures import DecisionFigures
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.control.step_contract import StepFigures
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.guard.numeric import Finding

# warmup 0-3 (3 also builds the check executor, 2 the twin's), baseline 4-5, stitched from 6 (6 and 7 check)
TIMING = Timing(warmup_steps=4, baseline_steps=2, probe_steps=0, check_first=2, check_every=100)


def _controller(tmp_path: Path, clusters: int = 2, **kwargs: bool) -> Controller:
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path), "STITCHFLEET_JOB_UID": "contract"})
    ledger = Ledger(current, 0, 1, f"sqlite:///{tmp_path / 't.db'}")
    found = [Cluster(i, f"{i:032x}", SimpleNamespace(bad=None), 3, **kwargs) for i in range(clusters)]
    return Controller(found, TIMING, ledger, 1, setup_seconds=1.5)


def _run(controller: Controller, step: int, **figures: object) -> None:
    plan = controller.step_plan(step)
    controller.step_done(plan, StepFigures(0.01, summed=plan.local, **figures))  # type: ignore[arg-type]


def test_a_plan_says_what_the_step_runs_and_cannot_be_changed(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    plans = []
    for step in range(8):
        plans.append(controller.step_plan(step))
        controller.step_done(plans[-1], StepFigures(0.01, summed=plans[-1].local))
    assert [p.on_twin for p in plans] == [False, False, True, True, False, False, True, True]
    assert [p.checks for p in plans] == [False, False, False, True, False, False, True, True]
    assert [p.judged for p in plans] == [()] * 6 + [(0, 1)] * 2  # the warmup's check build judges nothing
    assert plans[6].switches.tolist() == [True, True] and not plans[4].switches.any()
    assert len(plans[6].local) == 2 + EXTRA and not plans[6].quiet
    with pytest.raises(ValueError):
        plans[6].switches[0] = False
    assert controller.check_counts == [2, 2]
    controller.ledger.close()


def test_the_warmup_builds_are_booked_with_the_setup_seconds(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    booked: list[float] = []
    controller.ledger.compiled = booked.append  # type: ignore[method-assign]
    for step in range(5):
        _run(controller, step)
    assert controller.warmup.seconds is not None and booked == [pytest.approx(1.5 + controller.warmup.seconds)]
    controller.ledger.close()


def test_a_step_that_could_not_be_prepared_only_joins_the_consensus_and_reverts_the_job(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    plan = controller.step_plan(6, "RuntimeError: boom", prepared=False)
    assert not plan.on_twin and not plan.checks and not plan.judged
    assert plan.local.tolist() == [0.0, 0.0, 1.0] + [0.0] * (EXTRA - 1)  # the fault flag after the clusters
    controller.step_done(plan, StepFigures(0.01, summed=plan.local))
    assert controller.job_reverted == "plugin error: RuntimeError: boom" and controller.done
    assert controller.step_plan(7).quiet  # stitching is over: nothing is added to the step
    controller.ledger.close()


def test_a_fault_met_between_calls_joins_the_next_plan(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    plan = controller.step_plan(6, "ValueError: late")
    assert plan.on_twin and plan.local[2] == 1.0
    controller.step_done(plan, StepFigures(0.01, summed=plan.local))
    assert controller.job_reverted == "plugin error: ValueError: late"
    controller.ledger.close()


def test_a_nonfinite_loss_counts_on_stitched_steps_only(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    for step in range(6):
        _run(controller, step, loss=math.nan)  # warmup and baseline: the user's own graph
    assert not controller.loss_bad and controller.job_reverted is None
    _run(controller, 6, loss=math.inf)
    assert controller.loss_bad and controller.job_reverted is None  # in the next step's figures
    _run(controller, 7)
    assert controller.job_reverted is not None and controller.job_reverted.startswith("non-finite loss")
    controller.ledger.close()


def test_a_mismatch_finding_reverts_its_cluster_at_the_next_decision(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    for step in range(6):
        _run(controller, step)
    bad = Finding(False, "out:0", 1.0, 0.1, "max |error| 1.0 exceeds the tolerance")
    _run(controller, 6, findings=((1, bad),))
    assert controller.pending == {1: bad} and controller.clusters[1].enabled
    plan = controller.step_plan(7)
    assert plan.local[:2].tolist() == [0.0, 1.0]
    controller.step_done(plan, StepFigures(0.01, summed=plan.local))
    assert [c.enabled for c in controller.clusters] == [True, False]
    assert controller.step_plan(8).switches.tolist() == [True, False]
    controller.ledger.close()


def test_clusters_off_from_the_start_are_flagged_for_every_rank(tmp_path: Path) -> None:
    controller = _controller(tmp_path, enabled=False)
    assert controller.pending == {0: "reverted by an earlier job", 1: "reverted by an earlier job"}
    assert controller.step_plan(0).quiet  # nothing can run stitched
    controller.ledger.close()


def test_a_step_with_nothing_to_say_is_neither_packed_nor_unpacked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 6: most stitched steps carry no flag, fault or decision; the controller then skips
    building, packing and unpacking the figures (before: both, every step). A flag is still heard."""
    controller = _controller(tmp_path)
    unpacked: list[int] = []
    real = DecisionFigures.unpack.__func__  # type: ignore[attr-defined]

    def counted(cls: type[DecisionFigures], vector: object, clusters: int) -> DecisionFigures:
        unpacked.append(len(unpacked))
        return real(cls, vector, clusters)  # type: ignore[no-any-return]

    monkeypatch.setattr(DecisionFigures, "unpack", classmethod(counted))
    for step in range(40):
        _run(controller, step)
    assert not controller.done and len(unpacked) <= 5, len(unpacked)  # brackets only (before: 40)
    controller.clusters[0].kernel.bad = "non-finite stitched output"  # as the native fault poll flags it
    _run(controller, 40)
    assert not controller.clusters[0].enabled and controller.clusters[1].enabled
    controller.ledger.close()


def test_a_steady_stitched_step_asks_numpy_for_nothing(tmp_path: Path) -> None:
    """Issue 29 item 6: a stitched step that checks and decides nothing makes no numpy call: its plan shares the
    read-only switch array of its vector with earlier plans and passes the all-zero figures as they are, and
    `decide` knows those figures by identity. Before: an array for the switches, `any` of them and of the summed
    figures, and two copies (`frozen`) every step: numpy's calls were most of what such a step cost the hook."""
    controller = _controller(tmp_path)
    for step in range(9):  # warmup, baseline, the first checks, the kernels' first run (`_first_run`)
        _run(controller, step)
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "c_call" and "numpy" in str(getattr(arg, "__module__", None) or type(getattr(arg, "__self__", 0))):
            calls[getattr(arg, "__qualname__", "?")] += 1

    sys.setprofile(profile)
    try:
        plans = []
        for step in range(9, 19):  # stitched steps: no check (every 100), no decision, no window closes
            plans.append(controller.step_plan(step))
            controller.step_done(plans[-1], StepFigures(0.01, summed=plans[-1].local))
    finally:
        sys.setprofile(None)
    assert all(p.on_twin and p.switches.tolist() == [True, True] and not p.judged for p in plans)
    assert all(not p.switches.flags.writeable and not p.local.flags.writeable for p in plans)
    assert all(p.switches is plans[0].switches for p in plans)  # one array for one vector
    assert calls == {}, calls
    assert controller.job_seconds == pytest.approx(0.19) and not controller.done  # every step booked
    plan = controller.step_plan(19)
    assert plan.switches is plans[0].switches and plan.switches.tolist() == [True, True]
    controller.clusters[1].enabled = False  # as a revert leaves it: the next plan has a vector of its own
    plan = controller.step_plan(20)
    assert plan.switches.tolist() == [True, False] and plans[0].switches.tolist() == [True, True]
    controller.ledger.close()


def test_the_plugins_own_work_on_a_step_is_charged_to_stitched_windows_never_to_the_baseline(tmp_path: Path) -> None:
    """Session 18: the step's timer covers its run only, so the plugin's work around it (planning the step, its
    feeds and fetches, reading its figures, judging its checks: 0.2-0.4 ms a step on the demo, tens of ms on a
    check step) was in no window, and the report booked it as saved against the wall clock. Here plain TF's step
    is 10 ms, a stitched step 8 ms, and the plugin works 1.5 ms around every step: 0.5 ms saved a stitched step."""
    now = [0.0]
    controller, rows = _timed_controller(tmp_path, now)
    for step in range(65):  # baseline 0-4, stitched 5-19, baseline 20-24, ... stitched 45-59, baseline 60-64
        plan = controller.step_plan(step)
        seconds = 0.008 if plan.on_twin else 0.010
        now[0] += 0.001 + seconds + 0.0005  # the plugin's work before and after the timed run
        controller.step_done(plan, StepFigures(seconds, summed=plan.local))
    now[0] += 1.0  # the job's end is no step's
    controller.finish()
    stitched = [r for r in rows if r["mode"] == "stitched"]
    assert [r["first_step"] for r in stitched] == [5, 25, 45]
    assert all(r["baseline_step_seconds"] == pytest.approx(0.010) for r in rows)  # plain TF's step, nothing added
    assert sum(float(r["saved_seconds"]) for r in stitched) == pytest.approx(45 * 0.0005)  # type: ignore[arg-type]
    assert stitched[0]["step_seconds_sum"] == pytest.approx(15 * 0.0095)  # what the steps cost the job
    assert controller.own_charged == pytest.approx(45 * 0.0015)  # the baseline steps' is paid by nobody
    controller.ledger.close()


def test_the_hooks_work_before_the_plan_and_after_the_booking_is_the_plugins_own_too(tmp_path: Path) -> None:
    """Session 18: the hook works on a step before `step_plan` (the run's bookkeeping, the shape signature) and
    after `step_done` (polling the guard's results): 0.08-0.16 ms a step on the demo, booked as saved while
    `step_plan` .. `step_done` was all the controller saw. With `step_entered` / `step_left` every stitched step
    pays its 0.4 + 0.3 ms too: plain TF 10 ms, stitched 9 ms, 1 + 0.4 + 0.3 ms of the plugin's work a step."""
    now = [0.0]
    controller, rows = _timed_controller(tmp_path, now)
    for step in range(65):  # baseline 0-4, stitched 5-19, baseline 20-24, ... stitched 45-59, baseline 60-64
        controller.step_entered()
        now[0] += 0.0004  # the hook before the plan
        plan = controller.step_plan(step)
        seconds = 0.009 if plan.on_twin else 0.010
        now[0] += 0.001 + seconds  # the plan's feeds and fetches, the run
        controller.step_done(plan, StepFigures(seconds, summed=plan.local))
        now[0] += 0.0003  # the hook after the booking
        controller.step_left()
    now[0] += 1.0  # the job's end is no step's
    controller.finish()
    stitched = [r for r in rows if r["mode"] == "stitched"]
    assert all(r["baseline_step_seconds"] == pytest.approx(0.010) for r in rows if r["mode"] != "baseline")
    # every stitched step follows another step, whose work after its booking it carries: 0.3 + 0.4 + 1 ms each
    assert controller.own_charged == pytest.approx(45 * (0.0003 + 0.0004 + 0.001))
    assert sum(float(r["saved_seconds"]) for r in stitched) == pytest.approx(  # type: ignore[arg-type]
        45 * 0.001 - controller.own_charged
    )
    controller.ledger.close()


def _timed_controller(tmp_path: Path, now: list[float]) -> tuple[Controller, list[dict[str, object]]]:
    """One cluster, baseline blocks of 5 steps every 20, on the clock `now[0]`; the rows its windows write."""
    timing = Timing(
        warmup_steps=0, baseline_steps=5, rebaseline_every=20, window_steps=20, probe_steps=0, paired_steps=5
    )
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path), "STITCHFLEET_JOB_UID": "own-work"})
    ledger = Ledger(current, 0, 1, f"sqlite:///{tmp_path / 't.db'}")
    found = [Cluster(0, f"{0:032x}", SimpleNamespace(bad=None), 3)]
    controller = Controller(found, timing, ledger, 1, clock=lambda: now[0])
    rows: list[dict[str, object]] = []
    controller.ledger.window = lambda **fields: rows.append(fields)  # type: ignore[method-assign]
    return controller, rows
