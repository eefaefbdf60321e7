"""The report's held-out check against the scan's own computation of it, from the raw rows.

Input: the hand-worked fleets of test_holdout.py and random fleets (jobs with 0-4 holdouts, GPU and CPU tasks of a
name, stitched runs of one or two ranks with random windows across three weeks), written through workload.py.
Output: for each week, `savings.weekly_summary` equal to `savings_scan.weekly_summary_scan` (report_compare), its
held-out checks (every field) and net after them included.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry import savings, savings_scan
from stitchfleet.telemetry.kinds import HOLDOUT_REASON
from tests.telemetry import test_holdout as hand
from tests.telemetry.report_compare import assert_same_report

WEEKS = ("2026-W46", "2026-W47", "2026-W48")
EVERY_TASK = 10_000  # the report lists every task, as the scan does
DAYS = range(9, 28)  # Nov 9-27 (a run's windows up to three days on): W46, W47, W48
SEEDS = range(8)
# One window: steps, mode, step seconds, reference step, saved seconds, recorded at.
Figures = tuple[int, str, float, float | None, float, dt.datetime]


def assert_report_is_the_scan(url: str) -> dict[str, savings.WeeklyReport]:
    """Each week's report equals the scan; the reports, for the caller to check that there was a check to compare."""
    reports = {week: savings.weekly_summary(url, week, listed=EVERY_TASK) for week in WEEKS}
    for week, report in reports.items():
        assert_same_report(report, savings_scan.weekly_summary_scan(url, week))
    return reports


def test_the_hand_fleet_on_both_databases(any_url: str) -> None:
    hand.write(any_url, hand.fleet() + hand.cpu_job())
    checked = assert_report_is_the_scan(any_url)["2026-W47"].held_out
    assert [(c.job_name, c.device_kind) for c in checked] == [(hand.JOB, "gpu"), (hand.JOB, "cpu")]


def _without_h2() -> list[r.Row]:
    return [row for row in hand.fleet() if getattr(row, "job", None) != hand.key(hand.JOB, "h2")]


def _other_week_and_kind() -> list[r.Row]:
    h8, s8 = hand.key(hand.JOB, "h8"), hand.key(hand.JOB, "s8")
    cpu = [hand.started(h8, hand.at(19, 1), kind="cpu"), *hand.holdout_run(h8, 19, 0.9)[1:]]
    cpu += [hand.started(s8, hand.at(19, 1), kind="cpu"), *hand.stitched_run(s8, 19, 3)]
    return hand.fleet() + hand.holdout_run(hand.key(hand.JOB, "h6"), 24, 0.3) + cpu


def _holdout_with_a_stitched_window() -> list[r.Row]:
    h9 = hand.key(hand.JOB, "h9")
    return [
        *hand.fleet(),
        *hand.holdout_run(h9, 19, 0.1),
        hand.window(h9, 2, hand.at(19, 4), (100, 10.0, 0.0), "stitched"),
    ]


@pytest.mark.parametrize(
    ("build", "checks"),
    [
        (hand.fleet, 1),
        (lambda: hand.fleet((0.1001, 0.0999)), 1),  # the in-job net above the interval
        (lambda: hand.fleet((0.1311, 0.1309)), 1),  # below it
        (_without_h2, 0),  # one holdout: no check (and none to compare but the net)
        (_other_week_and_kind, 1),
        (_holdout_with_a_stitched_window, 1),
        (lambda: hand.fleet() + hand.cpu_job(), 2),
    ],
    ids=["main", "above", "below", "one-holdout", "other-week-and-kind", "holdout-stitched", "gpu-and-cpu"],
)
def test_the_hand_fleets_on_sqlite(sqlite_url: str, build: Callable[[], list[r.Row]], checks: int) -> None:
    hand.write(sqlite_url, build())
    assert len(assert_report_is_the_scan(sqlite_url)["2026-W47"].held_out) == checks


def _when(chooser: random.Random, start: dt.datetime | None = None) -> dt.datetime:
    """A random hour of DAYS, or an instant of the three days from `start` (a run's windows)."""
    if start is None:
        return dt.datetime(2026, 11, chooser.choice(DAYS), chooser.randrange(24), tzinfo=dt.UTC)
    return start + dt.timedelta(minutes=chooser.randrange(3 * 24 * 60))


def _started(job: r.JobKey, kind: str, per_rank: int, ranks: int, when: dt.datetime) -> list[r.Row]:
    gpus = per_rank if kind == "gpu" else 0
    return [
        r.JobStarted(
            job, rank, "ml", "m", f"pod-{rank}", ranks, gpus, "", when, device_kind=kind, devices_per_rank=per_rank
        )
        for rank in range(ranks)
    ]


def _windows(job: r.JobKey, rank: int, figures: list[Figures]) -> list[r.Row]:
    """Rank `rank`'s windows, in order, one per `figures`."""
    return [
        r.StepWindow(job, rank, index, index * 1000, index * 1000 + window[0] - 1, *window)
        for index, window in enumerate(figures)
    ]


def _holdout(chooser: random.Random, job: r.JobKey, kind: str, own: float) -> list[r.Row]:
    """A single-rank run as written, of mean step `own`: baseline or warmup windows, now and then a stitched one."""
    start = _when(chooser)
    rows = [*_started(job, kind, chooser.choice((1, 2, 4)), 1, start), r.Event(job, "setup", reason=HOLDOUT_REASON)]
    figures: list[Figures] = []
    for _ in range(chooser.randint(1, 3)):
        steps, mode = chooser.randint(20, 200), chooser.choice(("baseline", "baseline", "warmup", "stitched"))
        figures.append((steps, mode, steps * own * chooser.uniform(0.99, 1.01), None, 0.0, _when(chooser, start)))
    return rows + _windows(job, 0, figures)


def _stitched(chooser: random.Random, job: r.JobKey, kind: str, plain: float) -> list[r.Row]:
    """A run of one or two ranks over three days from its start (a week's end now and then among them): baseline,
    warmup and stitched windows (none stitched one time in six); its in-job reference stands 0-15% above the plain
    step and its stitched step 0-15% below, so that its claim can fall above, within or below the interval."""
    ranks, per_rank, start = chooser.randint(1, 2), chooser.choice((1, 2, 8)), _when(chooser)
    rows = [*_started(job, kind, per_rank, ranks, start), r.Event(job, "setup", reason="setup 3.20 s")]
    rows += [r.JobCompiled(job, rank, chooser.uniform(0.0, 40.0)) for rank in range(ranks)]
    rows += [r.JobOverhead(job, rank, chooser.uniform(0.0, 8.0)) for rank in range(ranks)]
    reference, stitched = plain * chooser.uniform(1.0, 1.15), plain * chooser.uniform(0.85, 1.0)
    modes = ["stitched"] * 3 + ["baseline", "warmup"] if chooser.random() > 1 / 6 else ["baseline", "warmup"]
    for rank in range(ranks):
        figures: list[Figures] = []
        for _ in range(chooser.randint(3, 9)):
            steps, mode = chooser.randint(50, 300), chooser.choice(modes)
            on = mode == "stitched"
            seconds = steps * (stitched if on else reference) * chooser.uniform(0.99, 1.01)
            saved = steps * reference * chooser.uniform(0.995, 1.005) - seconds if on else 0.0
            figures.append((steps, mode, seconds, reference if on else None, saved, _when(chooser, start)))
        rows += _windows(job, rank, figures)
    return rows


def random_fleet(seed: int) -> list[r.Row]:
    """Four or five job names on two clusters, each on GPU and/or CPU (another job each), 0-4 holdouts (the first
    job at least two) and 1-3 stitched runs apiece; a plain step per job and a spread of its holdouts of 0.5-5%."""
    chooser = random.Random(seed)
    rows: list[r.Row] = []
    for number in range(chooser.randint(4, 5)):
        cluster, name = chooser.choice(("gpu-east", "gpu-west")), f"job-{number}"
        for kind in chooser.sample(("gpu", "cpu"), chooser.randint(1, 2)):
            plain, spread, uid = chooser.uniform(0.05, 0.5), chooser.choice((0.005, 0.02, 0.05)), f"{kind}-{number}"
            for index in range(chooser.randint(2 if number == 0 else 0, 4)):
                job = r.JobKey(cluster, "vision", name, f"h{index}-{uid}")
                rows += _holdout(chooser, job, kind, plain * chooser.gauss(1.0, spread))
            for index in range(chooser.randint(1, 3)):
                rows += _stitched(chooser, r.JobKey(cluster, "vision", name, f"s{index}-{uid}"), kind, plain)
    return rows


@pytest.mark.parametrize("seed", SEEDS)
def test_random_fleets_on_sqlite(sqlite_url: str, seed: int) -> None:
    hand.write(sqlite_url, random_fleet(seed))
    reports = assert_report_is_the_scan(sqlite_url)
    assert sum(len(report.held_out) for report in reports.values()) > 0  # something was checked


def test_the_random_fleets_reach_every_verdict(tmp_path: Path) -> None:
    """Over the seeds, the checks compared above hold every verdict: no rule is left out of the comparison."""
    verdicts = set()
    for seed in SEEDS:
        url = f"sqlite:///{tmp_path}/fleet-{seed}.db"
        hand.write(url, random_fleet(seed))
        verdicts |= {c.verdict for week in WEEKS for c in savings.weekly_summary(url, week).held_out}
    assert verdicts == {"above", "within", "below"}


@pytest.mark.postgres
def test_a_random_fleet_on_postgresql(pg_url: str) -> None:
    hand.write(pg_url, random_fleet(7))
    assert sum(len(report.held_out) for report in assert_report_is_the_scan(pg_url).values()) > 0
