"""weekly_summary: the tiny fleet's figures, worked out by hand (see tiny_fleet), on both backends."""

from __future__ import annotations

import datetime as dt

import pytest

from stitchfleet.telemetry import database, savings, weeks
from tests.telemetry.tiny_fleet import write_fleet

H = 3600.0


def _by_run(report: savings.WeeklyReport) -> dict[tuple[str, str], savings.JobSavings]:
    return {(job.job_name, job.job_uid): job for job in report.jobs}


def test_tasks_of_the_week(any_url: str) -> None:
    write_fleet(any_url)
    report = savings.weekly_summary(any_url, "2026-W47")
    jobs = _by_run(report)
    assert set(jobs) == {("resnet-a", "run-1"), ("resnet-a", "run-2"), ("bert-b", "run-1"), ("vit-c", "run-1")}
    # Ordered by net GPU-hours saved: B 340 s, A2 0 s, A -30 s, C -80 s (GPU-seconds): only B's saving is
    # claimed, its 5 paired windows agreeing exactly; A's 4 spread too far (`paired.claim`), A2 and C pair too few.
    assert [job.job_name for job in report.jobs] == ["bert-b", "resnet-a", "resnet-a", "vit-c"]

    a = jobs[("resnet-a", "run-1")]
    assert (a.devices, a.windows, a.iterations, a.status, a.revert_reason) == (1, 5, 5000, "finished", "")
    assert a.baseline_step_seconds == pytest.approx(0.2, rel=1e-12)
    assert a.stitched_step_seconds == pytest.approx((0.15 + 0.16) / 2, rel=1e-12)  # even count: mean of middle two
    assert a.speedup is None and a.within_noise  # measured 180 s, its interval holds 0: nothing claimed
    assert (a.measured_hours, a.gross_hours, a.compile_hours) == (180 / H, 0.0, 30 / H)
    assert a.low_hours is not None and a.high_hours is not None and a.low_hours < 0.0 < a.high_hours
    assert a.net_hours == -30 / H

    b = jobs[("bert-b", "run-1")]
    assert (b.world_size, b.device_kind, b.devices_per_rank, b.devices, b.windows, b.iterations) == (
        4,
        "gpu",
        2,
        8,
        9,
        1500,
    )
    assert (b.baseline_step_seconds, b.stitched_step_seconds) == (pytest.approx(0.5), pytest.approx(0.4))
    # 5 stitched windows x 50 s over ranks, x 2 GPUs per rank; compile: slowest rank (20 s) x 8 GPUs.
    assert (b.gross_hours, b.compile_hours) == (500 / H, 160 / H)
    assert b.speedup == pytest.approx(1.25) and not b.within_noise

    a2 = jobs[("resnet-a", "run-2")]
    # One paired window: its own figures (16 s of steps, 36 s saved: 0.52 s a step around it), no interval.
    assert (a2.baseline_step_seconds, a2.stitched_step_seconds) == (pytest.approx(0.52), pytest.approx(0.16))
    assert (a2.gross_hours, a2.compile_hours, a2.status, a2.low_hours) == (0.0, 0.0, "running", None)


def test_a_task_crossing_the_week_boundary(any_url: str) -> None:
    write_fleet(any_url)
    c47 = _by_run(savings.weekly_summary(any_url, "2026-W47"))[("vit-c", "run-1")]
    assert (c47.windows, c47.iterations, c47.gross_hours, c47.compile_hours) == (4, 400, 0.0, 80 / H)
    assert c47.measured_hours == 40 / H and c47.within_noise  # two paired windows: no interval
    assert (c47.status, c47.revert_reason) == ("reverted", "numeric_mismatch")
    week48 = savings.weekly_summary(any_url, weeks.parse_week("2026-W48"))
    assert [job.job_name for job in week48.jobs] == ["vit-c"]
    c48 = week48.jobs[0]
    # The compile was charged to W47, where the task started; W48 has no baseline window: the step figures
    # are its stitched windows' and the reference (0.5 s) they carry.
    assert (c48.windows, c48.iterations, c48.gross_hours, c48.compile_hours) == (4, 400, 0.0, 0.0)
    assert (c48.baseline_step_seconds, c48.stitched_step_seconds) == (pytest.approx(0.5), pytest.approx(0.4))


def test_totals_rollups_and_days(any_url: str) -> None:
    write_fleet(any_url)
    report = savings.weekly_summary(any_url, "2026-W47")
    t = report.totals
    assert (t.tasks, t.jobs, t.distributed_tasks, t.gpu.devices, t.iterations) == (4, 3, 2, 12, 5000 + 100 + 1500 + 400)
    assert t.gpu.gross_hours == pytest.approx(500 / H, rel=1e-12)  # B's, the one claimed
    assert t.gpu.compile_hours == pytest.approx(270 / H, rel=1e-12)
    assert t.gpu.net_hours == pytest.approx(230 / H, rel=1e-12)
    assert (t.reverted_tasks, t.reverted_share) == (1, 0.25)
    # C's two revert events (numeric_mismatch, then nan): one task and one revert under each reason.
    assert [(x.reason, x.tasks, x.reverts) for x in t.revert_reasons] == [("nan", 1, 1), ("numeric_mismatch", 1, 1)]
    assert [k.device_kind for k in t.by_kind] == ["gpu"] and t.kind("cpu").tasks == 0

    rollups = {(r.dimension, r.key): r for r in report.rollups if r.device_kind == "gpu"}
    assert len(rollups) == len(report.rollups)
    assert set(rollups) == {
        ("namespace", "vision"),
        ("namespace", "nlp"),
        ("team", "ml"),
        ("team", "nlp"),
        ("model", "resnet50"),
        ("model", "bert"),
        ("model", "vit"),
    }
    vision = rollups[("namespace", "vision")]
    assert (vision.tasks, vision.devices, vision.reverted_tasks) == (3, 4, 1)
    assert vision.gross_hours == 0.0
    assert vision.net_hours == pytest.approx(-110 / H, rel=1e-12)
    assert rollups[("model", "resnet50")].net_hours == pytest.approx(-30 / H, rel=1e-12)

    assert [d.day for d in report.daily] == [dt.date(2026, 11, day) for day in range(16, 23)]
    expected = [500, 0, 0, 0, 0, 0, 0]  # GPU-seconds per day, Monday first: claimed tasks' only
    assert [d.gross_gpu_hours for d in report.daily] == pytest.approx([s / H for s in expected], rel=1e-12)


def test_a_task_with_no_recorded_start(tmp_path: object, sqlite_url: str) -> None:
    from stitchfleet.telemetry import rows as r
    from stitchfleet.telemetry import store
    from tests.telemetry.tiny_fleet import at, key, window

    database.upgrade(sqlite_url)
    late = key("vision", "late")
    engine = database.connect(sqlite_url)
    with engine.begin() as connection:
        store.write_rows(
            connection, [r.JobCompiled(late, 0, 36.0), window((late, 0, 0), at(19, 3), (10, 2.0, 0.0), "baseline")]
        )
    engine.dispose()
    # Its compile is charged to the week of its first window.
    job = savings.weekly_summary(sqlite_url, "2026-W47").jobs[0]
    assert (job.job_name, job.compile_hours, job.net_hours) == ("late", 36 / H, -36 / H)


def test_an_empty_week(sqlite_url: str) -> None:
    write_fleet(sqlite_url)
    report = savings.weekly_summary(sqlite_url, "2026-W40")
    assert (report.jobs, report.rollups, report.totals.tasks, report.totals.reverted_share) == ((), (), 0, 0.0)
    assert [d.gross_gpu_hours for d in report.daily] == [0.0] * 7


@pytest.mark.parametrize("label", ["2026-47", "2026W47", "26-W47", "2026-W54", "2025-W53", "next week", ""])
def test_a_bad_week_label_names_the_format(label: str) -> None:
    with pytest.raises(weeks.WeekError, match="expected an ISO week YYYY-Www"):
        weeks.parse_week(label)


def test_week_bounds() -> None:
    week = weeks.parse_week("2026-W53")
    assert (week.start, week.end) == (dt.datetime(2026, 12, 28, tzinfo=dt.UTC), dt.datetime(2027, 1, 4, tzinfo=dt.UTC))
    assert weeks.week_of(dt.datetime(2027, 1, 3, 23, 59, tzinfo=dt.UTC)) == week
    assert not week.contains(week.end)


def test_no_schema_is_a_clear_error(sqlite_url: str) -> None:
    with pytest.raises(database.DatabaseError, match="run `stitchfleet db upgrade`"):
        savings.weekly_summary(sqlite_url, "2026-W47")


@pytest.mark.parametrize(
    ("baseline", "stitched", "gross", "expected"),
    [
        (0.2, 0.16, 1.0, 1.25),  # faster, hours saved: the speedup stands
        (0.2, 0.25, -1.0, 0.8),  # slower, hours lost: it stands too
        (0.2, 0.2, 0.0, None),  # nothing claimed (within noise): no speedup either
        (0.144, 0.1579, 0.0038, None),  # issue 29: "0.912x" beside +0.0038 core-h gross
        (0.0105, 0.00999, -0.000069, None),  # issue 29: "1.051x" beside -0.000069 gross
        (None, 0.2, 1.0, None),
        (0.2, None, 1.0, None),
    ],
)
def test_a_speedup_never_disagrees_in_sign_with_the_gross(
    baseline: float | None, stitched: float | None, gross: float, expected: float | None
) -> None:
    found = savings.speedup(baseline, stitched, gross)
    assert found == (pytest.approx(expected) if expected is not None else None)


def test_every_tasks_speedup_agrees_in_sign_with_its_gross(sqlite_url: str) -> None:
    """Issue 29 item 5 on a whole synthetic week (noisy windows, reverts, several ranks): a row shows a speedup only
    beside a claimed saving, over 1 beside hours saved and under 1 beside hours lost; and its net is its gross less
    the compile and the plugin overhead, so a task claiming nothing never books a positive net."""
    from stitchfleet.telemetry import synthetic

    database.upgrade(sqlite_url)
    synthetic.generate(sqlite_url, synthetic.FleetSpec(tasks=60, week=weeks.parse_week("2026-W47"), seed=3))
    tasks = list(savings.week_tasks(sqlite_url, "2026-W47"))
    assert len(tasks) == 60 and any(t.speedup is not None for t in tasks)
    for task in tasks:
        if task.speedup is not None:
            assert (task.speedup > 1.0) == (task.gross_hours > 0.0), task
        else:
            assert task.gross_hours == 0.0 or task.baseline_step_seconds is None, task
        assert task.net_hours == pytest.approx(task.gross_hours - task.compile_hours - task.overhead_hours)
        assert task.gross_hours != 0.0 or task.net_hours <= 0.0
