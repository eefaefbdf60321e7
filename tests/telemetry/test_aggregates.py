"""Incremental rollups: whatever the order rows arrive in, duplicates and corrections included, the
aggregates the store keeps equal the aggregates recomputed from scratch, and the weekly report
read from them equals the report recomputed from every row."""

from __future__ import annotations

import dataclasses
import itertools
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from stitchfleet.telemetry import aggregates, database, savings, savings_scan, store, synthetic
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.weeks import parse_week
from tests.telemetry import tiny_fleet
from tests.telemetry.report_compare import assert_same_figures, assert_same_report

WEEKS = ("2026-W46", "2026-W47", "2026-W48")
EVERY_TASK = 10_000


def _corrected(row: r.Row) -> r.Row:
    """The same window sent again with other figures (the later one wins, by the store's rule)."""
    assert isinstance(row, r.StepWindow)
    return dataclasses.replace(row, saved_seconds=row.saved_seconds + 7.0, iterations=row.iterations + 3)


def _rows() -> list[r.Row]:
    # The tiny fleet (several runs of a job, ranks, a week boundary, two reverts of a task), a
    # few synthetic tasks, and a CPU task whose device kind is only known once a rank says so.
    spec = synthetic.FleetSpec(tasks=5, week=parse_week("2026-W47"), seed=4, reverted_share=0.5, max_windows=3)
    cpu = tiny_fleet.key("batch", "cpu-etl")
    extra: list[r.Row] = [
        r.JobStarted(cpu, 0, "data", "etl", world_size=2, gpus_per_rank=0, started_at=tiny_fleet.at(19, 1)),
        r.JobStarted(cpu, 1, world_size=2, gpus_per_rank=0, device_kind="cpu", devices_per_rank=4),
        tiny_fleet.window((cpu, 0, 0), tiny_fleet.at(19, 2), (100, 30.0, 0.0), "baseline"),
        r.StepWindow(cpu, 1, 1, 100, 199, 100, "stitched", 20.0, 0.3, 10.0, tiny_fleet.at(20, 2)),
        r.JobFinished(cpu, "reverted", "slower than baseline", ended_at=tiny_fleet.at(20, 3)),
        # the plugin's own cost: the slowest rank's counts, a rank's older figure never lowers it (any order)
        r.JobOverhead(cpu, 0, 0.8),
        r.JobOverhead(cpu, 1, 1.2),
        r.JobOverhead(cpu, 1, 0.4),
        r.JobOverhead(tiny_fleet.B, 3, 2.5),
    ]
    return tiny_fleet.fleet() + list(synthetic.fleet_rows(spec)) + extra


ROWS = _rows()
WINDOWS = [index for index, row in enumerate(ROWS) if isinstance(row, r.StepWindow)]


def _write(engine: Engine, batches: Sequence[Sequence[r.Row]]) -> None:
    for batch in batches:
        with engine.begin() as connection:
            store.write_rows(connection, batch)


def _table(engine: Engine, table: Any) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(select(table))]
    return sorted(rows, key=lambda row: tuple(str(row[column.name]) for column in table.primary_key))


def assert_incremental_equals_scratch(engine: Engine) -> None:
    """The kept aggregates equal a rebuild from scratch, and reports equal the full scan."""
    kept = [_table(engine, aggregates.TASK_WEEKS), _table(engine, aggregates.ROLLUPS)]
    reports = {week: savings.weekly_summary(engine, week, listed=EVERY_TASK) for week in WEEKS}
    with engine.begin() as connection:
        aggregates.rebuild(connection)
    rebuilt = [_table(engine, aggregates.TASK_WEEKS), _table(engine, aggregates.ROLLUPS)]
    assert [len(rows) for rows in kept] == [len(rows) for rows in rebuilt]
    assert_same_figures(
        [tuple(row.items()) for rows in kept for row in rows], [tuple(row.items()) for rows in rebuilt for row in rows]
    )
    for week, report in reports.items():
        assert_same_report(report, savings_scan.weekly_summary_scan(engine, week))


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    """A migrated, empty SQLite file, copied for each example (migrating costs more than a copy)."""
    folder = Path(tempfile.mkdtemp(prefix="stitchfleet-aggregates-"))
    database.upgrade(f"sqlite:///{folder / 'template.db'}")
    yield folder / "template.db"
    shutil.rmtree(folder, ignore_errors=True)


arrivals = st.tuples(
    st.permutations(range(len(ROWS))),
    st.lists(st.integers(0, len(ROWS) - 1), max_size=30),  # replays
    st.lists(st.sampled_from(WINDOWS), max_size=5),  # corrections of windows
    st.lists(st.integers(1, len(ROWS) + 35), max_size=6),  # batch boundaries
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrival=arrivals)
def test_any_arrival_order_gives_the_recomputed_figures(template: Path, arrival: Any) -> None:
    order, replays, corrections, cuts = arrival
    sequence = [ROWS[index] for index in order] + [ROWS[index] for index in replays]
    sequence += [_corrected(ROWS[index]) for index in corrections]
    bounds = sorted({0, len(sequence), *(cut for cut in cuts if cut < len(sequence))})
    batches = [sequence[start:end] for start, end in itertools.pairwise(bounds)]
    with tempfile.TemporaryDirectory(prefix="stitchfleet-example-") as folder:
        target = Path(folder) / "telemetry.db"
        shutil.copy(template, target)
        engine = database.connect(f"sqlite:///{target}")
        try:
            _write(engine, batches)
            assert_incremental_equals_scratch(engine)
        finally:
            engine.dispose()


@pytest.mark.postgres
def test_shuffled_batches_on_postgresql(pg_url: str) -> None:
    database.upgrade(pg_url)
    chooser = random.Random(21)
    sequence = chooser.sample(ROWS, len(ROWS)) + chooser.choices(ROWS, k=40)
    engine = database.connect(pg_url)
    try:
        _write(engine, [sequence[start : start + 37] for start in range(0, len(sequence), 37)])
        assert_incremental_equals_scratch(engine)
    finally:
        engine.dispose()


def test_a_revert_after_the_fact_moves_the_task(sqlite_url: str) -> None:
    """A task reported finished, then a revert event arrives: reverted, counted under its reason."""
    database.upgrade(sqlite_url)
    engine = database.connect(sqlite_url)
    job = tiny_fleet.key("vision", "late-revert")
    first = [
        r.JobStarted(job, started_at=tiny_fleet.at(17, 1)),
        r.StepWindow(job, 0, 0, 0, 9, 10, "stitched", 2.0, 0.7, 5.0, tiny_fleet.at(17, 2)),
        r.JobFinished(job, "finished", ended_at=tiny_fleet.at(17, 3)),
    ]
    revert = r.Event(job, "revert", reason="nan", occurred_at=tiny_fleet.at(17, 2), uuid="late-1")
    try:
        _write(engine, [first])
        before = savings.weekly_summary(engine, "2026-W47").totals
        _write(engine, [[revert], [revert]])
        after = savings.weekly_summary(engine, "2026-W47").totals
        assert (before.reverted_tasks, before.revert_reasons) == (0, ())
        assert after.reverted_tasks == 1
        assert [(x.reason, x.tasks, x.reverts) for x in after.revert_reasons] == [("nan", 1, 1)]
        assert_incremental_equals_scratch(engine)
    finally:
        engine.dispose()


def test_upgrading_a_database_with_telemetry_fills_the_aggregates(sqlite_url: str) -> None:
    """Rows written before migration 0003 (its tables dropped here) are in the first report after it."""
    tiny_fleet.write_fleet(sqlite_url)
    database.downgrade(sqlite_url, "0002")
    database.upgrade(sqlite_url)
    report = savings.weekly_summary(sqlite_url, "2026-W47")
    assert report.totals.tasks == 4
    assert_same_report(report, savings_scan.weekly_summary_scan(sqlite_url, "2026-W47"))


def _write_retrying(engine: Engine, batches: Sequence[Sequence[r.Row]]) -> None:
    """Writes batches as a writer does: a batch PostgreSQL aborted (deadlock) is written again."""
    from sqlalchemy.exc import OperationalError

    for batch in batches:
        for attempt in range(ATTEMPTS):
            try:
                with engine.begin() as connection:
                    store.write_rows(connection, batch)
                break
            except OperationalError as err:
                if "deadlock" not in str(err) or attempt == ATTEMPTS - 1:
                    raise


ATTEMPTS = 8


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_two_concurrent_writers_on_postgresql(pg_url: str) -> None:
    """Two writers sending the same tasks in other orders at once: the kept aggregates stay exact."""
    import threading

    database.upgrade(pg_url)
    engine = database.connect(pg_url, pool_size=2)
    sequences = [random.Random(seed).sample(ROWS, len(ROWS)) for seed in (1, 2)]
    failures: list[BaseException] = []

    def writer(sequence: list[r.Row]) -> None:
        try:
            _write_retrying(engine, [sequence[start : start + 9] for start in range(0, len(sequence), 9)])
        except BaseException as err:  # handed to the test thread
            failures.append(err)

    threads = [threading.Thread(target=writer, args=(sequence,)) for sequence in sequences]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(100)
        assert not failures, failures
        assert_incremental_equals_scratch(engine)
    finally:
        engine.dispose()
