"""`stitchfleet report weekly`: computes a week's savings and writes it as md, csv or html.

Input: the command's options (database URL, ISO week, format, CSV table, top tasks, output file).
Output: the rendered report on stdout or in the file, and an exit status: 0 done, 2 for a bad
week label or a database that cannot be used (unreachable, no schema), 1 when the output file
cannot be written. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.telemetry import database, report_text, savings, weeks

EXIT_OK = 0
EXIT_OUTPUT = 1
EXIT_USAGE = 2
FORMATS = ("md", "csv", "html")
CSV_TABLES = ("jobs", "rollups")


@dataclass(frozen=True)
class WeeklyOptions:
    """What the user asked for; `week` None means the current ISO week (UTC)."""

    db: str | None = None
    week: str | None = None
    format: str = "md"
    csv_table: str = "jobs"
    top: int = 0
    output: Path | None = None


def render(report: savings.WeeklyReport, options: WeeklyOptions) -> str:
    """The report in the requested format."""
    if options.format == "csv":
        return report_text.rollups_csv(report) if options.csv_table == "rollups" else report_text.jobs_csv(report)
    if options.format == "html":
        from stitchfleet.telemetry import report_html

        return report_html.render_html(report, options.top)
    return report_text.render_markdown(report, options.top)


def _fail(message: str, status: int) -> int:
    print(f"stitchfleet report weekly: {message}", file=sys.stderr)
    return status


def run_weekly(options: WeeklyOptions) -> int:
    """Runs the command; see the module docstring for the exit statuses."""
    try:
        week = weeks.parse_week(options.week) if options.week else weeks.week_of(dt.datetime.now(dt.UTC))
    except weeks.WeekError as err:
        return _fail(str(err), EXIT_USAGE)
    url = database.resolve_url(options.db)
    try:
        report = savings.weekly_summary(url, week)
    except database.DatabaseError as err:
        return _fail(str(err), EXIT_USAGE)
    content = render(report, options)
    if options.output is None:
        sys.stdout.write(content)
        return EXIT_OK
    try:
        options.output.write_text(content, encoding="utf-8")
    except OSError as err:
        return _fail(f"cannot write {options.output}: {err.strerror or err}", EXIT_OUTPUT)
    print(f"wrote {options.format} report for {week.label} ({report.totals.tasks:,} tasks) to {options.output}")
    return EXIT_OK
