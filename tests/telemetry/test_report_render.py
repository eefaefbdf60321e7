"""Renderers of the weekly report: Markdown aligned, CSV parses back to the figures, HTML has its PNG."""

from __future__ import annotations

import base64
import csv
import io
import re

import pytest

from stitchfleet.telemetry import report_html, report_text, savings, weeks
from tests.telemetry.tiny_fleet import write_fleet


@pytest.fixture
def report(sqlite_url: str) -> savings.WeeklyReport:
    write_fleet(sqlite_url)
    return savings.weekly_summary(sqlite_url, "2026-W47")


def _tables(markdown: str) -> list[list[str]]:
    blocks: list[list[str]] = [[]]
    for line in markdown.splitlines():
        if line.startswith("|"):
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [block for block in blocks if block]


def test_markdown_tables_are_aligned(report: savings.WeeklyReport) -> None:
    markdown = report_text.render_markdown(report)
    tables = _tables(markdown)
    assert len(tables) == 7  # totals, reasons, days, namespace, team, model, tasks saving most
    for table in tables:
        assert len({len(line) for line in table}) == 1, table  # every line equally wide
        assert re.fullmatch(r"\|(-+:?\|)+", table[1])
    tasks = tables[-1]
    assert len(tasks) == 2 + 4
    assert tasks[2].split("|")[4].strip() == "bert-b"
    assert "1.250x" in tasks[2]
    assert "| numeric_mismatch |" in markdown
    assert "Net GPU-hours saved" in markdown and "0.14 |" in markdown  # 486 GPU-seconds
    assert "Every task of the week is listed above." in markdown  # four tasks: no separate bottom table
    assert "One telemetry row is one step window" in markdown
    assert (
        markdown.rstrip()
        .splitlines()[-1]
        .startswith("How figures are attributed: One telemetry row (a step window) covers")
    )


def test_top_and_bottom_tasks(sqlite_url: str) -> None:
    write_fleet(sqlite_url)
    report = savings.weekly_summary(sqlite_url, "2026-W47", listed=1)
    assert [job.job_name for job in report.jobs] == ["bert-b"]
    assert [job.job_name for job in report.bottom] == ["vit-c"]  # net -40 GPU-seconds, the least
    markdown = report_text.render_markdown(report)
    assert "the 1 saving most of 4 tasks" in markdown and "the 1 saving least" in markdown
    tables = _tables(markdown)
    assert len(tables) == 8 and "| vit-c " in tables[-1][2] and "| bert-b " in tables[-2][2]
    assert "<td>vit-c</td>" in report_html.render_html(report)


def test_rollup_tables_are_cut_and_say_so(sqlite_url: str) -> None:
    from stitchfleet.telemetry import database, store
    from stitchfleet.telemetry import rows as r
    from tests.telemetry.tiny_fleet import at

    database.upgrade(sqlite_url)
    engine = database.connect(sqlite_url)
    models = [f"model-{index:02d}" for index in range(report_text.ROLLUP_ROWS + 5)]
    with engine.begin() as connection:
        store.write_rows(
            connection, [r.JobStarted(r.JobKey("c", "ns", m, "u"), model=m, started_at=at(17, 1)) for m in models]
        )
    engine.dispose()
    report = savings.weekly_summary(sqlite_url, "2026-W47")
    markdown = report_text.render_markdown(report)
    model_table = _tables(markdown.split("## By model")[1])[0]
    assert len(model_table) == 2 + report_text.ROLLUP_ROWS
    assert "5 more model rows in the CSV" in markdown
    parsed = list(csv.DictReader(io.StringIO(report_text.rollups_csv(report))))
    assert sum(1 for row in parsed if row["dimension"] == "model") == len(models)


def test_jobs_csv_parses_back(sqlite_url: str) -> None:
    write_fleet(sqlite_url)
    jobs = list(savings.week_tasks(sqlite_url, "2026-W47"))
    parsed = list(csv.DictReader(io.StringIO(report_text.jobs_csv(weeks.parse_week("2026-W47"), jobs))))
    assert len(parsed) == len(jobs) == 4
    for row, job in zip(parsed, jobs, strict=True):
        assert row["week"] == "2026-W47"
        assert (row["job_name"], row["job_uid"], int(row["devices"])) == (job.job_name, job.job_uid, job.devices)
        assert float(row["net_hours"]) == job.net_hours
        assert row["revert_reason"] == job.revert_reason
    assert float(parsed[0]["speedup"]) == pytest.approx(1.25)


def test_rollups_csv_ends_with_the_fleet(report: savings.WeeklyReport) -> None:
    parsed = list(csv.DictReader(io.StringIO(report_text.rollups_csv(report))))
    assert [(row["dimension"], row["key"]) for row in parsed][-1] == ("fleet", "all")
    assert len(parsed) == len(report.rollups) + 1
    fleet = parsed[-1]
    assert (int(fleet["tasks"]), int(fleet["reverted_tasks"])) == (4, 1)
    assert float(fleet["net_hours"]) == report.totals.gpu.net_hours
    assert sum(int(row["tasks"]) for row in parsed if row["dimension"] == "team") == 4


def test_html_embeds_the_chart(report: savings.WeeklyReport) -> None:
    page = report_html.render_html(report)
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert match is not None
    png = base64.b64decode(match.group(1))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert page.count("<table>") == 6  # totals, reasons, three rollups, tasks (all listed: no bottom table)
    assert "<td>bert-b</td>" in page and "numeric_mismatch" in page
    assert "How figures are attributed" in page


def test_html_escapes_names(sqlite_url: str) -> None:
    from stitchfleet.telemetry import database, store
    from stitchfleet.telemetry import rows as r
    from tests.telemetry.tiny_fleet import at, window

    database.upgrade(sqlite_url)
    odd = r.JobKey("c", "ns", "<script>x</script>", "u")
    engine = database.connect(sqlite_url)
    with engine.begin() as connection:
        store.write_rows(connection, [window((odd, 0, 0), at(17, 1), (10, 1.0, 2.0), "baseline")])
    engine.dispose()
    page = report_html.render_html(savings.weekly_summary(sqlite_url, "2026-W47"))
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page


def test_an_empty_week_renders(sqlite_url: str) -> None:
    write_fleet(sqlite_url)
    report = savings.weekly_summary(sqlite_url, "2026-W30")
    assert "No task was reverted." in report_text.render_markdown(report)
    assert list(savings.week_tasks(sqlite_url, "2026-W30")) == []
    assert report_text.jobs_csv(report.week, []).splitlines()[0].startswith("week,cluster,namespace")
    assert "data:image/png;base64," in report_html.render_html(report)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0.00"),
        (1234.567, "1,234.57"),
        (0.0049, "0.0049"),
        (0.000062, "0.000062"),
        (-0.00011, "-0.00011"),
        (1e-12, "1.0e-12"),
    ],
)
def test_small_gpu_hours_keep_two_significant_digits(value: float, text: str) -> None:
    """A short job's saving (or loss) must not print as 0.00 or -0.00."""
    assert report_text.hours(value) == text
