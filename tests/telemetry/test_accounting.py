"""Accounting a finance team can sign: device kinds, devices per rank, reverted tasks, the row's span.

Each case writes a few rows on top of nothing (or the tiny fleet) and checks the weekly report's
figures by hand: CPU jobs are in CPU core-hours and never in GPU-hours, a rank's measured devices
win over the pod's allocation, and a task with any cluster reverted counts as reverted.
"""

from __future__ import annotations

import datetime as dt

import pytest

from stitchfleet.telemetry import database, savings
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.report_text import render_markdown, rollups_csv
from tests.telemetry.tiny_fleet import at, key, write_fleet
from tests.telemetry.workload import write

H = 3600.0


def _write(url: str, rows: list[r.Row]) -> None:
    database.upgrade(url)
    write(url, rows)


def window(
    where: tuple[r.JobKey, int, int], when: dt.datetime, figures: tuple[int, float, float], mode: str
) -> r.StepWindow:
    """Window `index` of `rank`: (iterations, step seconds sum, saved seconds), baseline 1 s/step."""
    job, rank, index = where
    iterations, total, saved = figures
    first = index * iterations
    return r.StepWindow(job, rank, index, first, first + iterations - 1, iterations, mode, total, 1.0, saved, when)


def _measured(job: r.JobKey, where: tuple[int, int], declared: int, measured: tuple[str, int]) -> r.JobStarted:
    """Rank `where[0]` of `where[1]` ranks, `declared` GPUs per rank, `measured` (kind, devices)."""
    rank, ranks = where
    kind, devices = measured
    return r.JobStarted(
        job, rank, "ml", "m", f"pod-{rank}", ranks, declared, "", at(17, 8), device_kind=kind, devices_per_rank=devices
    )


def test_a_cpu_job_is_in_cpu_core_hours_never_in_gpu_hours(any_url: str) -> None:
    write_fleet(any_url)
    cpu_job = key("batch", "cpu-ranker")
    rows: list[r.Row] = [_measured(cpu_job, (0, 1), 1, ("cpu", 4)), r.JobCompiled(cpu_job, 0, 9.0)]
    rows += [window((cpu_job, 0, i), at(17, 9, i), (100, 10.0, 10.0), "stitched") for i in range(3)]  # 3 paired
    _write(any_url, rows)
    report = savings.weekly_summary(any_url, "2026-W47")
    job = next(j for j in report.jobs if j.job_name == "cpu-ranker")
    assert (job.device_kind, job.devices_per_rank, job.devices, job.unit) == ("cpu", 4, 4, "CPU core-hours")
    # 30 saved seconds on each of 4 cores; the compile held all 4 cores for 9 s.
    assert (job.gross_hours, job.compile_hours) == (pytest.approx(120 / H), pytest.approx(36 / H))
    t = report.totals
    assert [k.device_kind for k in t.by_kind] == ["gpu", "cpu"]
    assert t.gpu.gross_hours == pytest.approx(500 / H)  # the tiny fleet's GPU figure, unchanged
    assert (t.kind("cpu").tasks, t.kind("cpu").gross_hours) == (1, pytest.approx(120 / H))
    assert report.daily[1].gross_cpu_core_hours == pytest.approx(120 / H)  # Tuesday, in its own series
    text = render_markdown(report)
    assert "Net CPU core-hours saved" in text and "Net GPU-hours saved" in text
    fleet_rows = [line for line in rollups_csv(report).splitlines() if ",fleet,all," in line]
    assert [line.split(",")[3] for line in fleet_rows] == ["gpu", "cpu"]


def test_ranks_sharing_a_pod_count_the_gpus_they_use_not_the_pods(sqlite_url: str) -> None:
    # 8 Horovod ranks in one pod whose container declares 8 GPUs: each rank measured 1 GPU.
    job = key("vision", "hvd8")
    rows: list[r.Row] = [_measured(job, (rank, 8), 8, ("gpu", 1)) for rank in range(8)]
    rows += [window((job, rank, 0), at(18, 9), (100, 10.0, 36.0), "stitched") for rank in range(8)]
    # The operator's view of the pod (declared only, unmeasured) arrives last and changes nothing.
    rows.append(r.JobStarted(job, 7, "ml", "m", "pod-0", 8, 8, "", at(17, 7)))
    _write(sqlite_url, rows)
    task = savings.weekly_summary(sqlite_url, "2026-W47").jobs[0]
    assert (task.devices_per_rank, task.devices) == (1, 8)  # was 8 x 8 = 64 when the pod's GPUs were booked
    assert task.gross_hours == pytest.approx(8 * 36 / H)


def test_an_unmeasured_job_falls_back_to_what_it_declared(sqlite_url: str) -> None:
    gpu, cpu = key("a", "declared-gpu"), key("a", "declared-none")
    rows: list[r.Row] = [r.JobStarted(gpu, 0, "", "", "", 1, 2), r.JobStarted(cpu, 0, "", "", "", 1, 0)]
    rows += [window((job, 0, 0), at(18, 9), (10, 1.0, 36.0), "stitched") for job in (gpu, cpu)]
    _write(sqlite_url, rows)
    jobs = {j.job_name: j for j in savings.weekly_summary(sqlite_url, "2026-W47").jobs}
    assert (jobs["declared-gpu"].device_kind, jobs["declared-gpu"].devices) == ("gpu", 2)
    assert (jobs["declared-none"].device_kind, jobs["declared-none"].devices) == ("cpu", 1)


def test_a_finished_job_with_a_reverted_cluster_is_a_reverted_task(any_url: str) -> None:
    job = key("nlp", "partly")
    rows: list[r.Row] = [_measured(job, (0, 1), 1, ("gpu", 1))]
    rows.append(window((job, 0, 0), at(18, 9), (10, 1.0, 3.6), "stitched"))
    for index, (reason, uid) in enumerate([("numeric_mismatch", "e1"), ("numeric_mismatch", "e2"), ("slower", "e3")]):
        rows.append(r.Event(job, "revert", 0, 10 + index, f"fp-{index}", reason, occurred_at=at(18, 9), uuid=uid))
    rows.append(r.JobFinished(job, "finished", ended_at=at(18, 10)))
    _write(any_url, rows)
    report = savings.weekly_summary(any_url, "2026-W47")
    assert (report.jobs[0].status, report.jobs[0].revert_reason) == ("finished", "numeric_mismatch")
    t = report.totals
    assert (t.reverted_tasks, t.gpu.reverted_tasks) == (1, 1)
    figures = [(x.reason, x.tasks, x.reverts) for x in t.revert_reasons]
    assert figures == [("numeric_mismatch", 1, 2), ("slower", 1, 1)]


def test_a_device_kind_is_validated() -> None:
    with pytest.raises(ValueError, match="device_kind='tpu'"):
        r.JobStarted(key("a", "b"), device_kind="tpu")
    with pytest.raises(ValueError, match="devices_per_rank=0"):
        r.JobStarted(key("a", "b"), device_kind="gpu", devices_per_rank=0)


def test_the_report_says_what_one_row_covers() -> None:
    assert "One telemetry row (a step window) covers one rank's consecutive training steps" in savings.ATTRIBUTION
    assert "never summed together" in savings.ATTRIBUTION
