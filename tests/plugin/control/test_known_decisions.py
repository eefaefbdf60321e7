"""Probes the fleet already answered are skipped, and probes the job's remaining steps cannot repay stop (TF-free).

Real compiled cluster kernels (sim backend) and a real SQLite ledger, as in test_probe_controller; the fleet's
memory is a `Recollection` holding decisions for these clusters' keys (fingerprint, device profile, shapes),
or the one the ledger recalls from the findings of earlier jobs recorded in the same database.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from stitchfleet import settings
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.schedule import STITCHED
from stitchfleet.plugin.fleet.fleet_memory import Recollection
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.slow_verdicts import SlowerVerdict
from tests.plugin.control.test_probe_controller import GROUP_STEPS, GROUPED, TIMING, _drive, _rows, _step_time

PROFILE = "cpu:test x2"
EXPIRES = dt.datetime.now(dt.UTC) + dt.timedelta(days=3)


def _controller(tmp: Path, kernels: Any, uid: str, job_steps: int | None = 100_000, **timing: Any) -> Controller:
    """A controller over `kernels` whose clusters carry a device profile and shapes (the fleet's keys)."""
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp / uid), "STITCHFLEET_JOB_UID": uid})
    ledger = Ledger(current, 0, 1, f"sqlite:///{tmp / 't.db'}")
    clusters = [
        Cluster(i, fp, kernel, ops, profile=PROFILE, shapes=f"f32[{i}]") for i, (fp, kernel, ops) in enumerate(kernels)
    ]
    return Controller(clusters, dataclasses.replace(TIMING, **timing), ledger, 1, job_steps=job_steps)


def _verdict(key: tuple[str, str, str], outcome: ProbeOutcome) -> SlowerVerdict:
    return SlowerVerdict(*key, jobs=2, expires=EXPIRES, outcome=outcome)


def _knows(controller: Controller, clusters: dict[int, ProbeOutcome], group: ProbeOutcome | None) -> None:
    """The fleet's memory as `Ledger.recall` leaves it: decisions for some clusters and the group."""
    verdicts = [_verdict((c.fingerprint, c.profile, c.shapes), clusters[k]) for k, c in enumerate(controller.clusters)
                if k in clusters]  # fmt: skip
    if group is not None:
        verdicts.append(_verdict(controller.group_key(), group))
    slower = tuple(v for v in verdicts if v.outcome == ProbeOutcome.SLOWER)
    faster = tuple(v for v in verdicts if v.outcome == ProbeOutcome.FASTER)
    controller.ledger.recollection = Recollection(frozenset(), "database", slower=slower, faster=faster)


def _probe_events(tmp: Path) -> list[tuple[str | None, str, int]]:
    return [(e.cluster_fingerprint, e.reason, e.step) for e in _rows(tmp, tables.Event) if e.kind == "probe"]


def test_a_group_and_clusters_the_fleet_found_faster_are_kept_without_a_probe(tmp_path: Path, kernels: Any) -> None:
    controller = _controller(tmp_path, kernels, "known", **GROUPED)
    faster = ProbeOutcome.FASTER
    _knows(controller, {0: faster, 1: faster, 2: faster}, faster)
    switched = _drive([controller], [_step_time(3.0, [-0.5, -0.5, -0.5], jitter=0.001)], steps=GROUP_STEPS)
    # warmup 0 and baseline 1-2, then the stitched phase right away: no group pair, no cluster pair
    assert [controller.mode(s) for s in (3, 11, 20)] == [STITCHED] * 3
    assert switched[3] == switched[GROUP_STEPS - 1] == [True] * 3
    assert controller.group_proven is True and controller.group_probe.startswith("group probe skipped: fleet: faster")
    assert all(c.kept and c.reason.startswith("known faster: probe skipped: fleet: faster on cpu:test x2")
               for c in controller.clusters)  # fmt: skip
    events = _probe_events(tmp_path)
    assert (None, "group proven (known to the fleet)", 0) in events
    skipped = [fp for fp, reason, _ in events if reason == "probe skipped: known to the fleet"]
    assert skipped == [c.fingerprint for c in controller.clusters]
    # a decision taken without a probe is no new finding for the fleet (else it would renew itself for ever)
    assert _rows(tmp_path, tables.ProbeVerdict) == []


def test_a_group_the_fleet_found_slower_turns_stitching_off_before_any_probe(tmp_path: Path, kernels: Any) -> None:
    """Issue 29: a warm Transformer ran its group probe's switched-on steps again in every job, to learn what
    the fleet knew. With the fleet's slower verdict for this group (and the per-cluster probes beyond the
    share of a job of unknown length), every step runs the user's graph from the first."""
    controller = _controller(tmp_path, kernels, "slow", job_steps=None, **GROUPED)
    _knows(controller, {}, ProbeOutcome.SLOWER)
    switched = _drive([controller], [_step_time(3.0, [0.2, 0.4, 0.3], jitter=0.001)], steps=GROUP_STEPS)
    assert controller.done and controller.group_proven is False
    assert not any(any(row) for row in switched)
    assert all(controller.step_plan(s).quiet for s in range(GROUP_STEPS))
    reasons = [(reason, step) for fp, reason, step in _probe_events(tmp_path) if fp is None]
    assert reasons == [("group not faster (known to the fleet)", 0), ("per-cluster probes skipped", 0)]


def test_only_the_clusters_the_fleet_does_not_know_are_probed(tmp_path: Path, kernels: Any) -> None:
    controller = _controller(tmp_path, kernels, "part")
    _knows(controller, {1: ProbeOutcome.FASTER}, None)
    # warmup 0, baseline 1-2, pairs of 4+4 steps for clusters 0 and 2 only (3-18), stitched from 19
    _drive([controller], [_step_time(3.0, [-0.5, 0.4, 0.3], jitter=0.001)], steps=40)
    assert controller.timing.probed_clusters == (0, 2)
    assert [controller.timing.subject(s) for s in (3, 11)] == [0, 2] and controller.mode(19) == STITCHED
    first, known, last = controller.clusters
    assert (first.kept, known.kept, last.kept) == (True, True, False)
    assert known.reason.startswith("known faster: probe skipped") and last.reason.startswith("slower than TF")
    assert controller.switches(30).tolist() == [True, True, False]


def test_probes_stop_when_the_steps_left_cannot_repay_them(tmp_path: Path, kernels: Any) -> None:
    """A proven group in a job whose remaining steps are too few for the per-cluster probes' share: they stop at
    the group's decision and every cluster stays on with the group (the probes would only measure mixed
    configurations that pay for their clusters' fallback functions)."""
    controller = _controller(tmp_path, kernels, "stop", job_steps=300, **GROUPED)  # 24 probe steps > 5% of 288
    switched = _drive([controller], [_step_time(3.0, [-0.3, -0.3, -0.3], jitter=0.001)], steps=30)
    assert controller.group_proven is True and [c.kept for c in controller.clusters] == [True] * 3
    assert all(c.reason.startswith("kept with the group: per-cluster probes stopped: 24 steps of them left")
               for c in controller.clusters)  # fmt: skip
    # stitched from step 12, but for the baseline window that confirms the kept set (steps 18-19)
    assert switched[12:] == [[True] * 3] * 6 + [[False] * 3] * 2 + [[True] * 3] * 10
    assert controller.mode(12) == STITCHED
    reasons = [(reason, step) for fp, reason, step in _probe_events(tmp_path) if fp is None]
    assert reasons == [("group proven", 11), ("per-cluster probes stopped", 11)]
    long = _controller(tmp_path / "long", kernels, "long", job_steps=100_000, **GROUPED)  # they fit: they run
    _drive([long], [_step_time(3.0, [-0.3, -0.3, -0.3], jitter=0.001)], steps=30)
    assert long.timing.stopped is None and long.timing.subject(20) == 1


def test_the_group_finding_of_two_jobs_is_known_to_the_third(tmp_path: Path, kernels: Any) -> None:
    """End to end through the database: two jobs whose group probe lost record it as findings for the group's
    key; the third job's ledger recalls the verdict (STITCHFLEET_SLOWER_JOBS 2) and skips the group probe."""
    for uid in ("first", "second"):
        job = _controller(tmp_path, kernels, uid, job_steps=None, **GROUPED)
        _drive([job], [_step_time(3.0, [0.2, 0.4, 0.3], jitter=0.001)], steps=12)
        assert job.group_proven is False and job.group_probe.startswith("+0.")
    findings = _rows(tmp_path, tables.ProbeVerdict)
    assert {(f.fingerprint, f.outcome) for f in findings} == {(job.group_key()[0], "slower")}
    third = _controller(tmp_path, kernels, "third", job_steps=None, **GROUPED)
    third.ledger.recall()
    switched = _drive([third], [_step_time(3.0, [0.2, 0.4, 0.3], jitter=0.001)], steps=12)
    assert third.done and not any(any(row) for row in switched)
    assert third.group_probe.startswith("group probe skipped: fleet: slower on cpu:test x2 for these shapes per 2 jobs")


def test_a_kernels_first_run_is_booked_as_setup_not_as_a_windows_loss(tmp_path: Path, kernels: Any) -> None:
    """Seen on the small BERT encoder: the first switched-on step without checks took 1.3 s (1.3 ms steps), in a
    probe window whose noise claimed nothing: booked nowhere, so the report's saving missed it against the wall
    clock. Now its time beyond the usual baseline step is setup, and no window or probe counts it."""
    controller = _controller(tmp_path, kernels, "first", probe_steps=0, check_every=1000, check_first=0)
    steady = _step_time(3.0, [-0.3, -0.3, -0.3], jitter=0.001)
    first_on = next(s for s in range(40) if controller.switches(s).any())

    def loading(step: int, on: Any) -> float:
        return steady(step, on) + (1.0 if step == first_on else 0.0)

    _drive([controller], [loading], steps=200)
    assert controller.first_seconds == pytest.approx(1.0 - 0.0003, abs=0.002)
    assert controller.setup_total == pytest.approx(controller.first_seconds)
    [job] = _rows(tmp_path, tables.Job)
    assert job.compile_seconds == pytest.approx(controller.first_seconds)
    saved = sum(w.saved_seconds for w in _rows(tmp_path, tables.StepWindow))
    assert 0.0 <= saved <= 0.9e-3 * 200  # no window books the load (-1 s): at most the steps' 0.9 ms gain
