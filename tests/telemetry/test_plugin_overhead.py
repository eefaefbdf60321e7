"""The plugin's own cost (rows.JobOverhead): stored as the slowest rank's, charged beside the compile, net less it.

The tiny fleet (tiny_fleet) with overhead rows added: the bert-b task, whose saving is claimed, and a CPU task whose
stitching never ran (baseline windows only), which must book minus its own cost, never a saving. The aggregates the
report reads and the scan from every row agree; the text report shows the column, in each task's own unit.
"""

from __future__ import annotations

import pytest

from stitchfleet.telemetry import report_text, savings, savings_scan
from stitchfleet.telemetry import rows as r
from tests.telemetry.tiny_fleet import B, at, key, write_fleet
from tests.telemetry.workload import write

H = 3600.0
SKIPPED = key("vision", "skipped-cpu")


def _overheads() -> list[r.Row]:
    # bert-b's ranks: the slowest (3 s) counts, whatever the order; a rank's older, smaller figure never lowers it.
    rows: list[r.Row] = [r.JobOverhead(B, rank, seconds) for rank, seconds in enumerate((1.0, 2.0, 3.0, 2.0))]
    rows.append(r.JobOverhead(B, 2, 0.5))
    started = r.JobStarted(SKIPPED, 0, "ml", "mlp", "pod-0", 1, 0, "", at(18, 8), "cpu", 2)
    rows += [started, r.JobCompiled(SKIPPED, 0, 5.0), r.JobOverhead(SKIPPED, 0, 1.5), r.JobOverhead(SKIPPED, 0, 1.0)]
    rows += [r.StepWindow(SKIPPED, 0, 0, 0, 99, 100, "baseline", 20.0, recorded_at=at(18, 9))]
    rows += [r.StepWindow(SKIPPED, 0, 1, 100, 199, 100, "reverted", 20.0, recorded_at=at(18, 10))]
    return rows


def _by_name(report: savings.WeeklyReport) -> dict[str, savings.JobSavings]:
    return {job.job_name: job for job in (*report.jobs, *report.bottom) if job.job_uid == "run-1"}


def test_overhead_is_charged_beside_the_compile_and_net_pays_it(any_url: str) -> None:
    write_fleet(any_url)
    write(any_url, _overheads())
    report = savings.weekly_summary(any_url, "2026-W47")
    jobs = _by_name(report)
    b = jobs["bert-b"]
    # slowest rank 3 s x 8 GPUs; claimed 500 GPU-s, compile 160
    assert (b.gross_hours, b.compile_hours, b.overhead_hours) == (500 / H, 160 / H, pytest.approx(24 / H))
    assert b.net_hours == pytest.approx((500 - 160 - 24) / H)
    assert b.speedup == pytest.approx(1.25)

    skipped = jobs["skipped-cpu"]
    # no stitched window: nothing measured or claimed; minus its own cost, in CPU core-hours (1.5 s x 2 cores)
    assert (skipped.device_kind, skipped.unit, skipped.gross_hours, skipped.speedup) == (
        "cpu",
        "CPU core-hours",
        0.0,
        None,
    )
    assert (skipped.compile_hours, skipped.overhead_hours) == (pytest.approx(10 / H), pytest.approx(3 / H))
    assert skipped.net_hours == pytest.approx(-13 / H) and skipped.net_hours < 0.0

    gpu, cpu = report.totals.gpu, report.totals.kind("cpu")
    assert (gpu.overhead_hours, gpu.net_hours) == (pytest.approx(24 / H), pytest.approx((230 - 24) / H))
    assert (cpu.overhead_hours, cpu.net_hours) == (pytest.approx(3 / H), pytest.approx(-13 / H))  # never summed
    nlp = next(x for x in report.rollups if (x.dimension, x.key) == ("namespace", "nlp"))
    assert (nlp.overhead_hours, nlp.net_hours) == (pytest.approx(24 / H), pytest.approx((500 - 160 - 24) / H))


def test_the_scan_from_every_row_agrees_with_the_aggregates(any_url: str) -> None:
    write_fleet(any_url)
    write(any_url, _overheads())
    kept, scanned = savings.weekly_summary(any_url, "2026-W47"), savings_scan.weekly_summary_scan(any_url, "2026-W47")
    for name, job in _by_name(kept).items():
        other = _by_name(scanned)[name]
        assert (other.overhead_hours, other.net_hours) == (
            pytest.approx(job.overhead_hours),
            pytest.approx(job.net_hours),
        )
    for kind in ("gpu", "cpu"):
        found, expected = scanned.totals.kind(kind), kept.totals.kind(kind)
        assert (found.overhead_hours, found.net_hours) == (
            pytest.approx(expected.overhead_hours),
            pytest.approx(expected.net_hours),
        )


def test_the_overhead_goes_to_the_week_of_the_start_only(sqlite_url: str) -> None:
    write_fleet(sqlite_url)
    write(sqlite_url, [r.JobOverhead(key("vision", "vit-c"), 1, 2.0)])  # vit-c started in W47, ran into W48
    c47 = _by_name(savings.weekly_summary(sqlite_url, "2026-W47"))["vit-c"]
    c48 = _by_name(savings.weekly_summary(sqlite_url, "2026-W48"))["vit-c"]
    assert (c47.overhead_hours, c48.overhead_hours) == (pytest.approx(4 / H), 0.0)  # 2 s x 2 GPUs, once
    assert c47.net_hours == pytest.approx(-(80 + 4) / H)


def test_the_text_report_shows_the_overhead_in_each_units_table(sqlite_url: str) -> None:
    write_fleet(sqlite_url)
    write(sqlite_url, _overheads())
    report = savings.weekly_summary(sqlite_url, "2026-W47")
    text = report_text.render_markdown(report)
    assert "| Overhead h |" in text and "Plugin overhead (measured), CPU core-hours" in text
    assert "Plugin overhead (measured), GPU-hours" in text
    assert "overhead_hours" in report_text.rollups_csv(report).splitlines()[0]
    row = report_text.job_cells(_by_name(report)["bert-b"])
    assert row[report_text.JOB_HEADER.index("Overhead h")] == report_text.hours(24 / H)
