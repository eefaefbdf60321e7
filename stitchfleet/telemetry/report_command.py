"""`stitchfleet report weekly`: computes a week's savings and writes it as md, csv or html.

Input: the command's options (database URL, ISO week, format, CSV table, tasks listed, output file).
Output: the rendered report on stdout or in the file (md and html end with the fleet's memory as
it is now: clusters quarantined for a mismatch and clusters slower on a device profile, by the
STITCHFLEET_SLOWER_* settings the operator answers pods with), and an exit status: 0 done, 2 for a bad
week label or a database that cannot be used (unreachable, no schema), 1 when the output file
cannot be written. Errors are one line on stderr, never a traceback. On the local database (no URL given),
the state directory's finished spool files are loaded first: jobs that ran as written spool their rows there
(`Ledger.spool_meanwhile`). Markdown and HTML read the
incremental aggregates (bounded size); the jobs CSV streams every task straight to the output in
constant memory, with progress on stderr when it goes to a file. The rollups and checks CSVs (the latter one row
per job of the held-out check) hold their table only: a header and rows, no prose.
"""

from __future__ import annotations

import datetime as dt
import itertools
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from stitchfleet import settings
from stitchfleet.telemetry import database, report_memory, report_text, savings, spool_ingest, weeks
from stitchfleet.telemetry.report_memory import MemoryView

EXIT_OK = 0
EXIT_OUTPUT = 1
EXIT_USAGE = 2
FORMATS = ("md", "csv", "html")
CSV_TABLES = ("jobs", "rollups", "checks")
PROGRESS_EVERY = 50_000


@dataclass(frozen=True)
class WeeklyOptions:
    """What the user asked for; `week` None means the current ISO week (UTC); `top` tasks listed
    at each end per device kind in md/html."""

    db: str | None = None
    week: str | None = None
    format: str = "md"
    csv_table: str = "jobs"
    top: int = savings.LISTED_TASKS
    output: Path | None = None


def render(report: savings.WeeklyReport, options: WeeklyOptions, memory: MemoryView | None = None) -> str:
    """The report in the requested format (md, html, or the rollups or checks CSV; the jobs CSV is streamed)."""
    if options.format == "csv":
        if options.csv_table == "checks":
            return report_text.checks_csv(report)
        return report_text.rollups_csv(report)
    if options.format == "html":
        from stitchfleet.telemetry import report_html

        return report_html.render_html(report, options.top, memory)
    return report_text.render_markdown(report, options.top, memory)


def read_memory(url: str) -> MemoryView:
    """The fleet's memory now, by the settings' slower rule; DatabaseError when it cannot be read."""
    current = settings.current()
    now = dt.datetime.now(dt.UTC)
    return report_memory.read(url, now=now, min_jobs=current.slower_jobs, ttl=current.slower_ttl)


def _fail(message: str, status: int) -> int:
    print(f"stitchfleet report weekly: {message}", file=sys.stderr)
    return status


def _streamed(jobs: Iterable[savings.JobSavings], counted: list[int], show: bool) -> Iterator[savings.JobSavings]:
    for job in jobs:
        counted[0] += 1
        if show and counted[0] % PROGRESS_EVERY == 0:
            print(f"\r  {counted[0]:>9,} tasks written", end="", file=sys.stderr, flush=True)
        yield job
    if show and counted[0] >= PROGRESS_EVERY:
        print(file=sys.stderr)


def _write_lines(lines: Iterable[str], output: TextIO) -> None:
    for line in lines:
        output.write(line)


def _jobs_csv(url: str, week: weeks.Week, output: Path | None) -> tuple[int, int]:
    """Streams the jobs CSV to stdout or `output`; returns (exit status, tasks written)."""
    counted = [0]
    tasks = savings.week_tasks(url, week)
    try:
        # The database is opened by the first task: a failure then leaves no half-written output.
        first = next(tasks, None)
    except database.DatabaseError as err:
        return _fail(str(err), EXIT_USAGE), 0
    every = itertools.chain([] if first is None else [first], tasks)
    lines = report_text.jobs_csv_lines(week, _streamed(every, counted, output is not None))
    try:
        if output is None:
            _write_lines(lines, sys.stdout)
        else:
            with output.open("w", encoding="utf-8") as handle:
                _write_lines(lines, handle)
    except database.DatabaseError as err:
        return _fail(str(err), EXIT_USAGE), counted[0]
    except OSError as err:
        return _fail(f"cannot write {output}: {err.strerror or err}", EXIT_OUTPUT), counted[0]
    return EXIT_OK, counted[0]


def _load_spooled(url: str) -> None:
    """The local spool's finished files into the local database before it is read; a failure is one line on
    stderr (the report then reads what the database holds)."""
    try:
        loaded = spool_ingest.claim(settings.current().spool_dir, url)
    except Exception as err:
        print(f"stitchfleet report: spooled telemetry not loaded: {err}", file=sys.stderr)
        return
    if loaded.problems:
        print(f"stitchfleet report: {len(loaded.problems)} damaged spool line(s) skipped", file=sys.stderr)


def _counted(report: savings.WeeklyReport, options: WeeklyOptions) -> str:
    """What the written file counts, for the line on stdout: the checks CSV's rows are jobs checked, not tasks."""
    if options.format == "csv" and options.csv_table == "checks":
        return f"{len(report.held_out):,} jobs checked"
    return f"{report.totals.tasks:,} tasks"


def run_weekly(options: WeeklyOptions) -> int:
    """Runs the command; see the module docstring for the exit statuses."""
    try:
        week = weeks.parse_week(options.week) if options.week else weeks.week_of(dt.datetime.now(dt.UTC))
    except weeks.WeekError as err:
        return _fail(str(err), EXIT_USAGE)
    url = database.resolve_url(options.db)
    if options.db is None:
        _load_spooled(url)
    if options.format == "csv" and options.csv_table == "jobs":
        status, tasks = _jobs_csv(url, week, options.output)
        if status == EXIT_OK and options.output is not None:
            print(f"wrote csv report for {week.label} ({tasks:,} tasks) to {options.output}")
        return status
    try:
        report = savings.weekly_summary(url, week, listed=options.top or savings.LISTED_TASKS)
        memory = read_memory(url) if options.format in ("md", "html") else None
    except database.DatabaseError as err:
        return _fail(str(err), EXIT_USAGE)
    content = render(report, options, memory)
    if options.output is None:
        sys.stdout.write(content)
        return EXIT_OK
    try:
        options.output.write_text(content, encoding="utf-8")
    except OSError as err:
        return _fail(f"cannot write {options.output}: {err.strerror or err}", EXIT_OUTPUT)
    print(f"wrote {options.format} report for {week.label} ({_counted(report, options)}) to {options.output}")
    return EXIT_OK
