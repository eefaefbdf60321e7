"""store: every row type upserts on its natural key; replays and reorderings change nothing."""

from __future__ import annotations

import random

from stitchfleet.telemetry import database, queries, store
from tests.telemetry.workload import figures, workload


def _write(url: str, rows: list, batch: int = 50) -> None:
    engine = database.connect(url)
    try:
        for start in range(0, len(rows), batch):
            with engine.begin() as connection:
                store.write_rows(connection, rows[start : start + batch])
    finally:
        engine.dispose()


def test_figures_of_a_workload(any_url: str) -> None:
    database.upgrade(any_url)
    _write(any_url, workload(windows=40, ranks=2))
    got = figures(any_url)
    expected_saved = round(2 * sum(0.0 if i % 10 == 0 else 1.0 - 0.01 * i for i in range(40)), 9)
    assert got["per_job"] == [("run-1", 2 * 40 * 100, expected_saved, 80)]
    # Rank 0 names the pod; the slowest rank's compile time is the overhead.
    assert got["jobs"] == [("run-1", "finished", 13.5, "pod-0", 2)]
    assert got["events"] == 1
    assert got["verdicts"] == [("fp-gelu", "enabled"), ("fp-ln-bwd", "reverted")]


def test_replayed_and_shuffled_batches_count_once(any_url: str) -> None:
    database.upgrade(any_url)
    rows = workload(windows=30, ranks=3)
    _write(any_url, rows)
    reference = figures(any_url)
    shuffled = rows * 2
    random.Random(7).shuffle(shuffled)
    _write(any_url, shuffled, batch=17)
    assert figures(any_url) == reference


def test_worst_status_and_sticky_revert_win_in_any_order(sqlite_url: str) -> None:
    from stitchfleet.telemetry import rows as r
    from tests.telemetry.workload import job_key

    database.upgrade(sqlite_url)
    key = job_key()
    finished = [r.JobFinished(key, "finished", rank=0), r.JobFinished(key, "reverted", "slower than baseline", rank=1)]
    verdicts = [r.ClusterVerdict("fp", "reverted", "nan"), r.ClusterVerdict("fp", "enabled")]
    _write(sqlite_url, finished[::-1] + verdicts[::-1])
    _write(sqlite_url, finished + verdicts)
    got = figures(sqlite_url)
    assert got["jobs"][0][1] == "reverted"
    assert got["verdicts"] == [("fp", "reverted")]
    assert queries.reverted_fingerprints(sqlite_url) == {"fp"}


def test_two_runs_of_a_same_named_job_stay_apart(sqlite_url: str) -> None:
    database.upgrade(sqlite_url)
    _write(sqlite_url, workload("run-1", windows=5) + workload("run-2", windows=3))
    per_job = figures(sqlite_url)["per_job"]
    assert [(uid, n) for uid, _it, _saved, n in per_job] == [("run-1", 10), ("run-2", 6)]
