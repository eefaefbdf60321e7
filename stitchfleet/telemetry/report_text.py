"""Text renderings of a WeeklyReport: Markdown for people, CSV for machines.

Input: a `savings.WeeklyReport` (or, for the jobs CSV, every task of the week as an iterable).
Output: a string, or CSV lines one at a time; Markdown also shows the fleet's memory when given it
(report_memory: clusters quarantined for a mismatch, clusters slower on a device profile). Markdown
tables are padded to aligned columns (numbers right-aligned), so they read in a terminal as well as
on a rendered page. The Markdown is bounded whatever the fleet's size: the top and bottom tasks
only, and at most ROLLUP_ROWS rows per rollup table. CSV is one table per output, with a header row:
`jobs_csv_lines` one row per task (full precision, empty cells for missing medians), streamed,
`rollups_csv` one row per (dimension, key, device kind) plus a final `fleet,all` row per device kind
with the totals, `checks_csv` one row per job of the held-out check (telemetry.holdout). GPU-hours and CPU
core-hours are separate figures everywhere, never summed. The CLI picks the table with
`--csv-table jobs|rollups|checks`. Markdown and HTML also hold the held-out check: a table of the jobs checked
against their holdout runs, and the net after the check in the totals.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Iterable, Iterator, Sequence

from stitchfleet.telemetry.holdout import CheckedNet, CheckVerdict, HeldOutCheck
from stitchfleet.telemetry.report_memory import MemoryView, more, sections
from stitchfleet.telemetry.savings import DEVICE_NOUNS, UNITS, DeviceTotals, JobSavings, Rollup, Totals, WeeklyReport
from stitchfleet.telemetry.weeks import Week

DIMENSION_TITLES = {"namespace": "Namespace", "team": "Team", "model": "Model"}
UNSET = "(unset)"
RUN_ID_CHARS = 12
# Rows per rollup (and revert reason) table in Markdown and HTML; the rollups CSV has them all.
ROLLUP_ROWS = 20


def hours(value: float) -> str:
    """Device-hours for people: thousands separated, two decimals; below 0.01 (a short or small job) two
    significant digits instead, so a real saving or loss does not read as 0.00 or -0.00."""
    size = abs(value)
    if size == 0.0 or size >= 0.005:
        return f"{value:,.2f}"
    decimals = min(1 - math.floor(math.log10(size)), 9)
    text = f"{value:.{decimals}f}"
    return text if float(text) != 0.0 else f"{value:.1e}"


def seconds(value: float | None) -> str:
    """A step time in seconds, or '-' when unknown."""
    return "-" if value is None else f"{value:.4f}"


def milliseconds(value: float) -> str:
    """A step time in milliseconds: a CPU job's steps of a millisecond or two read as 0.0015 in seconds."""
    return f"{value * 1e3:,.3f}"


def ratio(value: float | None) -> str:
    """A speedup like 1.18x, or '-' when unknown."""
    return "-" if value is None else f"{value:.3f}x"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> str:
    """A Markdown table with every column padded to its widest cell; numeric columns right-aligned."""
    cells = [[_cell(text) for text in row] for row in [header, *rows]]
    widths = [max(3, *(len(row[index]) for row in cells)) for index in range(len(header))]

    def line(row: Sequence[str]) -> str:
        padded = (t.rjust(w) if num else t.ljust(w) for t, w, num in zip(row, widths, numeric, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        ("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric, strict=True)
    )
    return "\n".join([line(cells[0]), rule + "|", *(line(row) for row in cells[1:])])


def totals_cells(totals: Totals, after_check: Sequence[CheckedNet] = ()) -> list[list[str]]:
    """Rows of the fleet totals table; with `after_check` (WeeklyReport.after_check), each device kind's net after
    the held-out check under its net."""
    share = f"{totals.reverted_tasks:,} ({totals.reverted_share:.1%})"
    rows = [
        ["Tasks (job runs)", f"{totals.tasks:,}"],
        ["Jobs (distinct names)", f"{totals.jobs:,}"],
        ["Distributed tasks", f"{totals.distributed_tasks:,}"],
        ["Iterations", f"{totals.iterations:,}"],
    ]
    checked = {found.device_kind: found for found in after_check}
    for kind in totals.by_kind or (totals.gpu,):
        rows += kind_cells(kind, checked.get(kind.device_kind))
    return [*rows, ["Reverted tasks (any cluster or the job)", share]]


def kind_cells(kind: DeviceTotals, after: CheckedNet | None = None) -> list[list[str]]:
    """The totals of one device kind, each figure named with its unit; `after`: its net after the held-out check."""
    label = "GPU" if kind.device_kind == "gpu" else "CPU"
    checked = (
        []
        if after is None
        else [
            [
                f"Net {kind.unit} after the held-out check (jobs checked: {after.checked_jobs:,})",
                hours(after.after_check_hours),
            ]
        ]
    )
    return [
        [f"{label} tasks", f"{kind.tasks:,}"],
        [f"{DEVICE_NOUNS[kind.device_kind]} (sum over tasks)", f"{kind.devices:,}"],
        [f"Gross {kind.unit} saved", hours(kind.gross_hours)],
        [f"Compile overhead, {kind.unit}", hours(kind.compile_hours)],
        [f"Plugin overhead (measured), {kind.unit}", hours(kind.overhead_hours)],
        [f"Net {kind.unit} saved", hours(kind.net_hours)],
        *checked,
    ]


def reason_cells(totals: Totals) -> list[list[str]]:
    """Rows of the revert reasons table (the ROLLUP_ROWS most frequent): reason, tasks, reverts, share."""
    return [
        [r.reason, f"{r.tasks:,}", f"{r.reverts:,}", f"{r.tasks / totals.reverted_tasks:.1%}"]
        for r in totals.revert_reasons[:ROLLUP_ROWS]
    ]


def more_rows(shown: int, total: int, what: str) -> str:
    """A note under a cut table ("" when nothing was cut)."""
    return f"{total - shown:,} more {what} in the CSV (`--format csv --csv-table rollups`)." if total > shown else ""


REASON_HEADER = ("Reason", "Tasks", "Reverts", "Share of reverted tasks")
REASON_NUMERIC = (False, True, True, True)


def _reasons_table(totals: Totals) -> str:
    if not totals.revert_reasons:
        return "No task was reverted."
    table = markdown_table(REASON_HEADER, reason_cells(totals), REASON_NUMERIC)
    note = more_rows(min(len(totals.revert_reasons), ROLLUP_ROWS), len(totals.revert_reasons), "reasons")
    return table + (f"\n\n{note}" if note else "")


def rollup_header(dimension: str) -> list[str]:
    """Header of a rollup table for `dimension` (hours in each row's unit, see Unit)."""
    return [
        DIMENSION_TITLES[dimension],
        "Unit",
        "Tasks",
        "Devices",
        "Gross h",
        "Compile h",
        "Overhead h",
        "Net h",
        "Reverted",
    ]


ROLLUP_NUMERIC = (False, False) + (True,) * 7


def dimension_rollups(rollups: Sequence[Rollup], dimension: str) -> list[Rollup]:
    """The rollups of one dimension (GPU first, by net hours saved)."""
    return [r for r in rollups if r.dimension == dimension]


def rollup_cells(rollups: Sequence[Rollup], dimension: str) -> list[list[str]]:
    """Display rows of the rollups of one dimension, the first ROLLUP_ROWS of them."""
    return [
        [
            r.key or UNSET,
            UNITS[r.device_kind],
            f"{r.tasks:,}",
            f"{r.devices:,}",
            hours(r.gross_hours),
            hours(r.compile_hours),
            hours(r.overhead_hours),
            hours(r.net_hours),
            f"{r.reverted_tasks:,}",
        ]
        for r in dimension_rollups(rollups, dimension)[:ROLLUP_ROWS]
    ]


JOB_HEADER = (
    "Namespace",
    "Team",
    "Model",
    "Job",
    "Run",
    "Devices",
    "Iterations",
    "Baseline s",
    "Stitched s",
    "Speedup",
    "Gross h",
    "Measured h (95% interval)",
    "Compile h",
    "Overhead h",
    "Net h",
    "Unit",
    "Status",
    "Revert reason",
)
JOB_NUMERIC = (False,) * 5 + (True,) * 10 + (False, False, False)


def measured(job: JobSavings) -> str:
    """The paired windows' saving and its 95% interval, 'within noise' when the interval holds zero (then the
    gross claims 0); '-' when nothing was measured."""
    if job.measured_hours == 0.0 and job.low_hours is None:
        return "-"
    interval = (
        "no interval"
        if job.low_hours is None or job.high_hours is None
        else (f"{hours(job.low_hours)} to {hours(job.high_hours)}")
    )
    return f"{'within noise: ' if job.within_noise else ''}{hours(job.measured_hours)} ({interval})"


def devices(job: JobSavings) -> str:
    """A task's devices for people: '8 GPUs (8 x 1)' or '4 CPU cores (1 x 4)'."""
    return f"{job.devices:,} {DEVICE_NOUNS[job.device_kind]} ({job.world_size} x {job.devices_per_rank})"


def job_cells(job: JobSavings) -> list[str]:
    """One task's row as display strings, in JOB_HEADER order."""
    return [
        job.namespace,
        job.team or UNSET,
        job.model or UNSET,
        job.job_name,
        job.job_uid[:RUN_ID_CHARS],
        devices(job),
        f"{job.iterations:,}",
        seconds(job.baseline_step_seconds),
        seconds(job.stitched_step_seconds),
        ratio(job.speedup),
        hours(job.gross_hours),
        measured(job),
        hours(job.compile_hours),
        hours(job.overhead_hours),
        hours(job.net_hours),
        job.unit,
        job.status,
        job.revert_reason or "-",
    ]


def _first_per_kind(jobs: Sequence[JobSavings], count: int | None) -> tuple[JobSavings, ...]:
    if not count:
        return tuple(jobs)
    seen: dict[str, int] = {}
    kept = []
    for job in jobs:
        seen[job.device_kind] = seen.get(job.device_kind, 0) + 1
        if seen[job.device_kind] <= count:
            kept.append(job)
    return tuple(kept)


def shown_jobs(report: WeeklyReport, top: int | None) -> tuple[tuple[JobSavings, ...], str]:
    """The tasks saving most that a human rendering lists (`top` per device kind, else all listed), and a caption."""
    jobs = _first_per_kind(report.jobs, top)
    caption = f"{len(jobs):,} tasks, GPU tasks first, by net hours saved"
    if len(jobs) < report.totals.tasks:
        caption = (
            f"the {len(jobs):,} saving most of {report.totals.tasks:,} tasks, up to {top or report.listed:,} per "
            "device kind, GPU first, by net hours saved; the jobs CSV lists every task"
        )
    return jobs, caption


def shown_bottom(report: WeeklyReport, top: int | None) -> tuple[tuple[JobSavings, ...], str]:
    """The tasks saving least (lowest first, `top` per device kind) not listed above, and a caption."""
    jobs = _first_per_kind(report.bottom, top)
    return jobs, f"the {len(jobs):,} saving least, up to {top or report.listed:,} per device kind, lowest first"


def _tasks_section(title: str, jobs: Sequence[JobSavings], empty: str) -> list[str]:
    table = markdown_table(JOB_HEADER, [job_cells(job) for job in jobs], JOB_NUMERIC) if jobs else empty
    return [title, table]


HELD_OUT_HEADER = (
    "Cluster",
    "Namespace",
    "Job",
    "Unit",
    "Holdout runs",
    "Plain step ms (± sd)",
    "Stitched runs",
    "Stitched step ms",
    "Compile + overhead s",
    "Saving between runs h (95% interval)",
    "In-job claim h",
    "In-job net h",
    "Verdict",
)
HELD_OUT_NUMERIC = (False,) * 4 + (True,) * 8 + (False,)
HELD_OUT_LEDE = (
    "Holdout runs (one in every STITCHFLEET_HOLDOUT_EVERY runs of a single-rank job that would set up runs as "
    "written and timed) measure plain TensorFlow's step in processes of their own. Per job with two or more this "
    "week: saving between runs = the holdouts' mean plain step x the stitched runs' steps - what those runs took "
    "(their steps, and compile and plugin overhead as the report charges them), with a 95% prediction interval "
    "(the plain mean's error and each run's own deviation, Student's t over the holdouts); beside it what the "
    "report claims in-job for the same runs and its net (the claim less the same compile and overhead), within, "
    "above or below that interval. The net after the check takes off what nets above their interval book beyond it."
)
NO_HELD_OUT = "No job had two holdout runs and a stitched run this week: nothing was checked between processes."
VERDICT_TEXT = {
    CheckVerdict.WITHIN.value: "net within interval",
    CheckVerdict.ABOVE.value: "net above interval",
    CheckVerdict.BELOW.value: "net below interval",
}


def held_out_cells(checks: Sequence[HeldOutCheck]) -> list[list[str]]:
    """Rows of the held-out check table (the first ROLLUP_ROWS jobs), in HELD_OUT_HEADER order."""
    return [
        [
            check.cluster,
            check.namespace,
            check.job_name,
            UNITS[check.device_kind],
            f"{check.holdout_runs:,}",
            f"{milliseconds(check.plain_step_seconds)} ± {milliseconds(check.plain_step_sd)}",
            f"{check.stitched_runs:,}",
            milliseconds(check.stitched_step_seconds),
            f"{check.charged_seconds:,.1f}",
            f"{hours(check.saving_hours)} ({hours(check.low_hours)} to {hours(check.high_hours)})",
            hours(check.claimed_hours),
            hours(check.in_job_net_hours),
            VERDICT_TEXT[check.verdict],
        ]
        for check in checks[:ROLLUP_ROWS]
    ]


def held_out_note(checks: Sequence[HeldOutCheck]) -> str:
    """A note under a cut held-out table ("" when every job checked is shown)."""
    left = len(checks) - ROLLUP_ROWS
    if left <= 0:
        return ""
    return f"{left:,} more jobs checked, not shown; the totals' net after the check counts them all."


def _held_out_section(report: WeeklyReport) -> list[str]:
    if not report.held_out:
        return ["## Held-out check", NO_HELD_OUT]
    table = markdown_table(HELD_OUT_HEADER, held_out_cells(report.held_out), HELD_OUT_NUMERIC)
    note = held_out_note(report.held_out)
    return ["## Held-out check", HELD_OUT_LEDE, table + (f"\n\n{note}" if note else "")]


def span(report: WeeklyReport) -> str:
    """The dates the week covers, for titles."""
    days = report.week.days()
    return f"{days[0].isoformat()} to {days[-1].isoformat()} (UTC)"


DAILY_HEADER = ("Day", "GPU-hours", "CPU core-hours")
ROW_COVERS = (
    "One telemetry row is one step window: one rank's consecutive training steps of one mode "
    "(baseline or stitched), up to STITCHFLEET_WINDOW_STEPS of them; the footer says how they are counted."
)


def _rollup_section(report: WeeklyReport, dimension: str) -> list[str]:
    found = dimension_rollups(report.rollups, dimension)
    table = markdown_table(rollup_header(dimension), rollup_cells(report.rollups, dimension), ROLLUP_NUMERIC)
    note = more_rows(min(len(found), ROLLUP_ROWS), len(found), f"{dimension} rows")
    return [f"## By {dimension}", table + (f"\n\n{note}" if note else "")]


def memory_parts(memory: MemoryView) -> list[str]:
    """The fleet memory's lists as Markdown: a heading, a sentence and a table (or why none) each."""
    parts = []
    for section in sections(memory):
        table = markdown_table(section.header, section.rows, section.numeric) if section.rows else section.empty
        note = more(section)
        parts += [f"## {section.title}", f"{section.lede} As of {memory.read_at:%Y-%m-%d %H:%M} UTC."]
        parts.append(table + (f"\n\n{note}" if note else ""))
    return parts


def render_markdown(report: WeeklyReport, top: int | None = None, memory: MemoryView | None = None) -> str:
    """The whole report as Markdown; `top` limits the task tables per device kind (None or 0: all listed);
    with `memory`, the fleet's quarantined and slower clusters too."""
    jobs, caption = shown_jobs(report, top)
    bottom, bottom_caption = shown_bottom(report, top)
    daily = [
        [day.day.strftime("%a %Y-%m-%d"), hours(day.gross_gpu_hours), hours(day.gross_cpu_core_hours)]
        for day in report.daily
    ]
    parts = [
        f"# stitchfleet weekly savings report: {report.week.label}",
        f"Week {span(report)}. {ROW_COVERS}",
        "## Fleet totals",
        markdown_table(["Figure", "Value"], totals_cells(report.totals, report.after_check), [False, True]),
        *_held_out_section(report),
        "## Why tasks were reverted",
        _reasons_table(report.totals),
        "## Gross hours saved per day",
        markdown_table(DAILY_HEADER, daily, [False, True, True]),
    ]
    for dimension in DIMENSION_TITLES:
        parts += _rollup_section(report, dimension)
    parts += _tasks_section(f"## Tasks saving most ({caption})", jobs, "No task ran this week.")
    parts += _tasks_section(
        f"## Tasks saving least ({bottom_caption})", bottom, "Every task of the week is listed above."
    )
    parts += memory_parts(memory) if memory is not None else []
    parts += ["---", f"How figures are attributed: {report.attribution}"]
    return "\n\n".join(parts) + "\n"


def _csv_value(value: object) -> object:
    return "" if value is None else value


def _csv(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[_csv_value(value) for value in row] for row in rows])
    return buffer.getvalue()


JOB_FIELDS = tuple(field.name for field in dataclasses.fields(JobSavings))


def _csv_line(values: Sequence[object]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([_csv_value(value) for value in values])
    return buffer.getvalue()


def jobs_csv_lines(week: Week, jobs: Iterable[JobSavings]) -> Iterator[str]:
    """The jobs CSV one line at a time: a header, then per task `week` and every JobSavings field
    at full precision. Holds one task at a time: constant memory whatever the fleet's size."""
    yield _csv_line(["week", *JOB_FIELDS])
    for job in jobs:
        yield _csv_line([week.label, *(getattr(job, name) for name in JOB_FIELDS)])


def jobs_csv(week: Week, jobs: Iterable[JobSavings]) -> str:
    """The whole jobs CSV as one string (small weeks, tests); `jobs_csv_lines` streams it."""
    return "".join(jobs_csv_lines(week, jobs))


ROLLUP_FIELDS = tuple(field.name for field in dataclasses.fields(Rollup))


def rollups_csv(report: WeeklyReport) -> str:
    """One row per rollup (dimension, key, device kind), then `fleet,all` per device kind with the totals."""
    rows = [[report.week.label, *(getattr(rollup, name) for name in ROLLUP_FIELDS)] for rollup in report.rollups]
    for kind in report.totals.by_kind:
        fleet = Rollup(
            dimension="fleet",
            key="all",
            device_kind=kind.device_kind,
            tasks=kind.tasks,
            devices=kind.devices,
            iterations=kind.iterations,
            gross_hours=kind.gross_hours,
            compile_hours=kind.compile_hours,
            net_hours=kind.net_hours,
            reverted_tasks=kind.reverted_tasks,
            overhead_hours=kind.overhead_hours,
        )
        rows.append([report.week.label, *(getattr(fleet, name) for name in ROLLUP_FIELDS)])
    return _csv(["week", *ROLLUP_FIELDS], rows)


# The checks CSV's columns: HeldOutCheck's fields, then its two derived figures and the verdict read from them. A
# field whose name lacks its unit, or says it in the Markdown's short words, is renamed for a spreadsheet (hours
# in the row's `unit`; seconds per rank).
CHECK_RENAMED = {
    "plain_step_seconds": "holdout_mean_step_seconds",
    "plain_step_sd": "holdout_step_sd_seconds",
    "stitched_step_seconds": "stitched_mean_step_seconds",
    "charged_seconds": "charged_rank_seconds",
    "saving_hours": "saving_between_runs_hours",
    "low_hours": "saving_low_hours",
    "high_hours": "saving_high_hours",
    "claimed_hours": "in_job_claim_hours",
}
CHECK_FIELDS = (
    *(field.name for field in dataclasses.fields(HeldOutCheck) if field.name != "verdict"),
    "in_job_net_hours",
    "excess_hours",
    "verdict",
)
_UNIT_AT = CHECK_FIELDS.index("device_kind") + 1  # `unit` follows the job's device kind
_CHECK_NAMES = [CHECK_RENAMED.get(name, name) for name in CHECK_FIELDS]
CHECK_HEADER = ("week", *_CHECK_NAMES[:_UNIT_AT], "unit", *_CHECK_NAMES[_UNIT_AT:])


def checks_csv(report: WeeklyReport) -> str:
    """One row per job of the held-out check (all of them, in the report's order: GPU first, nets furthest above
    their interval first), every figure at full precision; a week without a check gives the header alone."""
    rows = []
    for check in report.held_out:
        values = [getattr(check, name) for name in CHECK_FIELDS]
        rows.append([report.week.label, *values[:_UNIT_AT], UNITS[check.device_kind], *values[_UNIT_AT:]])
    return _csv(CHECK_HEADER, rows)
