"""The synthetic fleet: deterministic for a seed, distributions near the requested ones, and the
bulk path writes exactly what the store's upserts would."""

from __future__ import annotations

import statistics

import pytest

from stitchfleet.telemetry import aggregates, savings, synthetic
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.weeks import parse_week
from tests.telemetry.report_compare import assert_same_report

WEEK = parse_week("2026-W47")


def test_same_seed_same_rows_other_seed_other_rows() -> None:
    spec = synthetic.FleetSpec(tasks=40, week=WEEK, seed=7)
    first, again = list(synthetic.fleet_rows(spec)), list(synthetic.fleet_rows(spec))
    assert first == again  # ids, uuids and times included
    other = list(synthetic.fleet_rows(synthetic.FleetSpec(tasks=40, week=WEEK, seed=8)))
    assert first != other


def test_distributions_match_the_paper_roughly() -> None:
    plans = list(synthetic.plan_tasks(synthetic.FleetSpec(tasks=4000, week=WEEK, seed=3)))
    distributed = [plan for plan in plans if plan.ranks > 1]
    assert 0.20 < len(distributed) / len(plans) < 0.26
    gpu_share = sum(p.gpu_seconds for p in distributed) / sum(p.gpu_seconds for p in plans)
    assert 0.45 < gpu_share < 0.67
    assert {p.ranks for p in plans} <= {1, 2, 4, 8, 16, 32, 64} and max(p.ranks for p in plans) >= 32
    speedups = [p.speedup for p in plans if p.revert_reason != "slowdown"]
    assert all(1.0 <= s <= 1.6 for s in speedups)
    assert sum(1.05 <= s <= 1.3 for s in speedups) / len(speedups) > 0.7
    assert all(p.speedup < 1.0 for p in plans if p.revert_reason == "slowdown")
    reasons = [p.revert_reason for p in plans if p.revert_reason]
    assert 0.025 < len(reasons) / len(plans) < 0.055
    assert set(reasons) == {"numeric_mismatch", "slowdown", "nan"}
    compile_median = statistics.median(p.compile_seconds for p in plans)
    assert 20.0 < compile_median < 60.0 and all(8.0 <= p.compile_seconds <= 240.0 for p in plans)
    assert all(WEEK.contains(p.started_at) for p in plans)


def test_rows_of_a_reverted_task() -> None:
    spec = synthetic.FleetSpec(tasks=400, week=WEEK, seed=5)
    plan, rows = next((p, rows) for p, rows in synthetic.fleet_tasks(spec) if p.revert_reason == "numeric_mismatch")
    windows = [row for row in rows if isinstance(row, r.StepWindow)]
    assert len(windows) == plan.ranks * (plan.windows + 1)
    stitched = [w for w in windows if w.mode == "stitched"]
    assert len(stitched) == plan.ranks * plan.revert_window
    assert all(w.saved_seconds == 0.0 for w in windows if w.mode != "stitched")
    events = [row for row in rows if isinstance(row, r.Event)]
    assert [(e.kind, e.reason) for e in events] == [("revert", "numeric_mismatch")]
    finished = rows[-1]
    assert isinstance(finished, r.JobFinished) and finished.status == "reverted"


def test_bad_spec_is_refused() -> None:
    with pytest.raises(ValueError, match=r"reverted_share=1\.5: expected a share between 0 and 1"):
        synthetic.FleetSpec(reverted_share=1.5)
    with pytest.raises(ValueError, match="tasks=0"):
        synthetic.FleetSpec(tasks=0)


def test_bulk_and_upsert_paths_give_the_same_report(
    any_url: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small enough a threshold that PostgreSQL's batches take the COPY path for task-weeks too.
    monkeypatch.setattr(aggregates, "COPY_FROM", 10)
    spec = synthetic.FleetSpec(tasks=120, week=WEEK, seed=11)
    seen: list[tuple[int, int]] = []
    written = synthetic.generate(any_url, spec, batch_rows=500, progress=lambda done, total: seen.append((done, total)))
    assert written == sum(1 for _ in synthetic.fleet_rows(spec))
    assert seen[-1] == (120, 120) and len(seen) > 1
    bulk = savings.weekly_summary(any_url, WEEK)
    # Writing again changes nothing (every write is keyed); the upsert path agrees.
    synthetic.generate(any_url, spec, batch_rows=500, bulk=False)
    assert_same_report(savings.weekly_summary(any_url, WEEK), bulk)
    plans = list(synthetic.plan_tasks(spec))
    assert bulk.totals.tasks == 120
    assert bulk.totals.reverted_tasks == sum(1 for p in plans if p.revert_reason)
    assert bulk.totals.distributed_tasks == sum(1 for p in plans if p.ranks > 1)
    assert bulk.totals.gpu.compile_hours == pytest.approx(sum(p.compile_seconds * p.ranks for p in plans) / 3600)
    assert bulk.totals.gpu.gross_hours > 0


def test_upsert_path_into_a_fresh_database(sqlite_url: str, tmp_path: object) -> None:
    spec = synthetic.FleetSpec(tasks=60, week=WEEK, seed=2)
    synthetic.generate(sqlite_url, spec, bulk=False)
    other = sqlite_url.replace("telemetry.db", "bulk.db")
    synthetic.generate(other, spec)
    assert_same_report(savings.weekly_summary(sqlite_url, WEEK), savings.weekly_summary(other, WEEK))
