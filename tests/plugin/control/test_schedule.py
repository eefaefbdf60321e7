"""The A/B schedule, step windows and job-level decisions (TF-free)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stitchfleet import settings
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.decision_figures import DecisionFigures, GuardFigures
from stitchfleet.plugin.control.schedule import BASELINE, STITCHED, WARMUP, Timing
from stitchfleet.plugin.control.step_windows import Windows
from stitchfleet.plugin.fleet.ledger import Ledger


def test_phases_follow_the_step_number() -> None:
    timing = Timing(warmup_steps=2, baseline_steps=3, rebaseline_every=10, probe_steps=0)
    phases = [timing.phase(s) for s in range(16)]
    assert phases[:2] == [WARMUP] * 2
    assert phases[2:5] == [BASELINE] * 3 and phases[5:12] == [STITCHED] * 7
    assert phases[12:15] == [BASELINE] * 3 and phases[15] == STITCHED


def test_checks_in_the_first_stitched_steps_and_every_k() -> None:
    timing = Timing(
        warmup_steps=2, baseline_steps=3, rebaseline_every=100, check_every=10, check_first=2, probe_steps=0
    )
    checked = [s for s in range(40) if timing.checks(s)]
    assert checked == [5, 6, 10, 20, 30]


def test_windows_close_on_mode_change_and_size_and_save_against_the_baseline() -> None:
    windows = Windows(size=3)
    closed = []
    for step, (mode, seconds) in enumerate([(BASELINE, 2.9), (BASELINE, 3.1), (STITCHED, 1.0), (STITCHED, 1.5)]):
        closed += windows.add(step, mode, seconds, timed=True)
    closed += windows.add(4, STITCHED, 9.0, timed=False)  # a check step: booked, not timed
    closed += windows.close()  # no baseline block after it: compared with the one before only
    assert [(w.mode, w.first_step, w.last_step) for w in closed] == [(BASELINE, 0, 1), (STITCHED, 2, 4)]
    assert windows.baseline_median == 3.0 and windows.stitched_median == 1.25
    assert closed[1].baseline == 3.0 and closed[1].saved_seconds == pytest.approx(3 * 3.0 - 11.5)


def test_a_window_books_its_whole_paired_difference_the_report_claims() -> None:
    """Issue 29: a window's difference from a baseline window that load moved was booked as a saving (the
    CIFAR-10 job's "1.348x" for a run 46 s slower than plain TF). Windows no longer gate on their own noise (which
    kept the windows that noise moved most): each books its whole difference, with its noise, and the report
    claims a task's saving only when its interval over every paired window excludes zero (`telemetry.paired`)."""
    spread = np.linspace(-0.5, 0.5, 20)
    baseline = 3.0 + spread
    for stitched_mean in (2.9, 3.1, 2.4, 3.6):
        windows = Windows(size=20)
        for step, seconds in enumerate(baseline):
            windows.add(step, BASELINE, float(seconds), True)
        closed = []
        for step, seconds in enumerate(stitched_mean + spread[::-1], start=20):
            closed += windows.add(step, STITCHED, float(seconds), True)
        [window] = closed + windows.close()
        assert window.saved_seconds == pytest.approx(20 * (3.0 - stitched_mean)) and window.noise > 0.0


def test_window_size_one_closes_both_windows() -> None:
    windows = Windows(size=1)
    assert len(windows.add(0, BASELINE, 1.0, timed=True)) == 1
    assert windows.add(1, STITCHED, 1.0, timed=True) == []  # waits for the baseline block after it
    assert [w.mode for w in windows.add(2, BASELINE, 1.0, timed=True)] == [STITCHED, BASELINE]


def _controller(tmp_path: Path, size: int = 1) -> Controller:
    """One enabled cluster (a job-level slowdown needs something stitched); its vector slot comes first."""
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path), "STITCHFLEET_JOB_UID": "sched"})
    ledger = Ledger(current, 0, size, f"sqlite:///{tmp_path / 't.db'}")
    clusters = [Cluster(0, "f" * 32, SimpleNamespace(bad=None), 3)]
    timing = Timing(warmup_steps=0, baseline_steps=2, slowdown_margin=0.05, probe_steps=0)
    return Controller(clusters, timing, ledger, size)


def _summed(fresh: float, stitched: float, base: float, noise: float = 0.0) -> np.ndarray:  # type: ignore[type-arg]
    """A summed consensus vector for the one-cluster controller: flag, fault, loss, the bracket figures."""
    return DecisionFigures((0.0,), GuardFigures(0, 0, fresh, stitched, base, noise)).pack()


def test_slowdown_beyond_the_margin_reverts_the_job(tmp_path: Path) -> None:
    controller = _controller(tmp_path, size=2)
    # two ranks, both with fresh brackets: stitched 1.1 s and 1.2 s, baseline 1.0 s each, in two verdicts in a row
    controller.decide(10, _summed(2, 2.3, 2.0))
    assert controller.job_reverted is None  # one verdict only makes the job suspect
    controller.decide(20, _summed(2, 2.3, 2.0))
    assert controller.job_reverted is not None and controller.job_reverted.startswith("slowdown")
    assert controller.mode(10) == "reverted" and not controller.switches(11).any()
    controller.ledger.close()


def test_slowdown_within_the_margin_or_without_every_rank_keeps_stitching(tmp_path: Path) -> None:
    controller = _controller(tmp_path, size=2)
    controller.decide(10, _summed(2, 2.08, 2.0))
    controller.decide(11, _summed(1, 5.0, 2.0))  # only one rank has fresh figures
    assert controller.job_reverted is None


def test_a_slowdown_within_the_noise_keeps_stitching(tmp_path: Path) -> None:
    """15% slower, but the bracket's standard error is 0.1 s per rank: not beyond 2 standard errors."""
    controller = _controller(tmp_path, size=2)
    controller.decide(10, _summed(2, 2.3, 2.0, noise=0.2))
    assert controller.job_reverted is None
    controller.decide(11, _summed(2, 2.3, 2.0, noise=0.1))
    controller.decide(12, _summed(2, 2.3, 2.0, noise=0.1))
    assert controller.job_reverted is not None and "noise 0.050000 s" in controller.job_reverted
    controller.ledger.close()
    controller.ledger.close()


def test_a_fault_or_a_nonfinite_loss_on_any_rank_reverts_the_job(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    loss = _summed(0, 0, 0)
    loss[2] = 1
    controller.decide(3, loss)
    assert controller.job_reverted is not None and controller.job_reverted.startswith("non-finite loss")
    other = _controller(tmp_path / "b")
    fault = _summed(0, 0, 0)
    fault[1] = 1
    other.decide(3, fault)
    assert other.job_reverted is not None and other.job_reverted.startswith("plugin error")
    controller.ledger.close()
    other.ledger.close()


def test_the_stitched_median_pools_every_stitched_step_since_the_last_baseline() -> None:
    """Regression: one noisy stitched window decided alone and reverted a job whose stitched steps were
    faster overall; the guard now compares all stitched steps since the baseline they are measured by."""
    windows = Windows(size=4)
    for step, seconds in enumerate([1.0] * 4):
        windows.add(step, BASELINE, seconds, timed=True)
    for step, seconds in enumerate([0.8] * 8 + [1.5] * 4, start=4):  # two fast windows, then a noisy one
        windows.add(step, STITCHED, seconds, timed=True)
    windows.close()
    assert windows.baseline_median == 1.0 and windows.stitched_median == 0.8
    for step in range(16, 20):
        windows.add(step, BASELINE, 0.9, timed=True)
    windows.add(20, STITCHED, 1.2, timed=True)
    windows.close()
    assert windows.stitched_median == 1.2  # a new baseline starts a new pool


def test_no_slowdown_revert_without_a_stitched_cluster(tmp_path: Path) -> None:
    controller = _controller(tmp_path, size=2)
    controller.clusters[0].enabled = False  # left to TF or reverted: nothing runs stitched
    controller.decide(10, _summed(2, 2.3, 2.0))
    assert controller.job_reverted is None
    controller.ledger.close()


def test_stitched_steps_are_compared_with_plain_tfs_steps_of_their_own_signature() -> None:
    """Regression (session 9, a bucketed text classifier): one median of a baseline window mixing 16- and
    64-token steps booked every stitched window as slower than plain TF whatever stitching did (median below
    the mean of a skewed mix). Now each stitched step is compared with the median of its own signature's
    baseline steps; a signature with fewer than MIN_BASELINE_STEPS of them claims nothing."""
    windows = Windows(size=100)
    mix = ["16"] * 6 + ["64"] * 3 + ["32"] * 2  # 32 tokens: 2 baseline steps, too few to be a baseline
    cost = {"16": 8.0, "32": 12.0, "64": 24.0}
    for step, signature in enumerate(mix):
        windows.add(step, BASELINE, cost[signature], True, signature)
    closed = windows.add(len(mix), STITCHED, 7.0, True, "16")  # one ms faster than plain TF at 16 tokens
    assert windows.baseline_median == 8.0 and windows.by_signature == {"16": 8.0, "64": 24.0}
    for step, signature in enumerate(["64", "16", "32", None], start=len(mix) + 1):
        windows.add(step, STITCHED, cost[signature or "16"] - 1.0, True, signature)
    *_, last = windows.close()
    assert closed[0].mode == BASELINE
    # before: 5 x 8.0 (one median) - (7 + 23 + 7 + 11 + 7) = -15 s "saved"; now 1 ms saved at each 16/64 step
    assert last.saved_seconds == pytest.approx(3.0)
    assert last.baselines == (8.0, 24.0, 8.0, None, None)
    assert last.baseline == pytest.approx(40.0 / 3)
