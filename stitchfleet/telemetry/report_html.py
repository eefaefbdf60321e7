"""HTML rendering of a WeeklyReport: one self-contained page with an embedded PNG chart.

Input: a `savings.WeeklyReport` and, optionally, the fleet's memory (report_memory). Output: an HTML
document (string) with the fleet totals, the held-out check, revert reasons, rollups (the first ROLLUP_ROWS of
each), the tasks saving most and least, the quarantined and slower clusters when given, and a chart
drawn with matplotlib's Agg canvas (no display, no pyplot global state): gross hours saved per day
and the top tasks by net hours, of one device kind (GPU when the week has GPU tasks, else CPU:
GPU-hours and CPU core-hours never share an axis), embedded as a base64 `data:` PNG so the page
needs no other file.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence

from stitchfleet.telemetry import report_text as text
from stitchfleet.telemetry.report_memory import MemoryView, more, sections
from stitchfleet.telemetry.savings import UNITS, JobSavings, WeeklyReport

CHART_TOP_TASKS = 10
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
footer { margin-top: 2em; font-size: 0.85em; color: #555; }
"""


def charted_kind(report: WeeklyReport) -> str:
    """The device kind the chart shows: GPU when the week has GPU tasks, else CPU (never both on one axis)."""
    kinds = [kind.device_kind for kind in report.totals.by_kind]
    return kinds[0] if kinds else "gpu"


def chart_png(report: WeeklyReport, top: int = CHART_TOP_TASKS) -> bytes:
    """The chart as PNG bytes: daily gross hours saved (left), top tasks by net (right), of one device kind."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    kind = charted_kind(report)
    unit = UNITS[kind]
    figure = Figure(figsize=(12, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    daily, best = figure.subplots(1, 2, width_ratios=(1, 1.3))
    days = [day.day.strftime("%a\n%m-%d") for day in report.daily]
    per_day = [day.gross_gpu_hours if kind == "gpu" else day.gross_cpu_core_hours for day in report.daily]
    daily.bar(days, per_day, color="#3a7dc9")
    daily.set_title(f"Gross {unit} saved per day, {report.week.label}")
    daily.set_ylabel(unit)
    leaders = [job for job in report.jobs if job.device_kind == kind][:top][::-1]
    labels = [f"{job.namespace}/{job.job_name}" for job in leaders]
    best.barh(range(len(leaders)), [job.net_hours for job in leaders], color="#48a868")
    best.set_yticks(range(len(leaders)), labels, fontsize=8)
    best.set_title(f"Top {len(leaders)} {kind.upper()} tasks by net {unit} saved")
    best.set_xlabel(unit)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> str:
    head = "".join(f"<th>{html.escape(name)}</th>" for name in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{html.escape(cell)}</td>' if num else f"<td>{html.escape(cell)}</td>"
            for cell, num in zip(row, numeric, strict=True)
        )
        + "</tr>\n"
        for row in rows
    )
    return f"<table>\n<tr>{head}</tr>\n{body}</table>"


def _reasons(report: WeeklyReport) -> str:
    if not report.totals.revert_reasons:
        return "<p>No task was reverted.</p>"
    return _table(text.REASON_HEADER, text.reason_cells(report.totals), text.REASON_NUMERIC)


def _rollups(report: WeeklyReport, dimension: str) -> str:
    rows = text.rollup_cells(report.rollups, dimension)
    found = len(text.dimension_rollups(report.rollups, dimension))
    note = text.more_rows(len(rows), found, f"{dimension} rows")
    table = _table(text.rollup_header(dimension), rows, text.ROLLUP_NUMERIC)
    return table + (f"\n<p>{html.escape(note)}</p>" if note else "")


def _held_out(report: WeeklyReport) -> list[str]:
    if not report.held_out:
        return [f"<p>{html.escape(text.NO_HELD_OUT)}</p>"]
    table = _table(text.HELD_OUT_HEADER, text.held_out_cells(report.held_out), text.HELD_OUT_NUMERIC)
    note = text.held_out_note(report.held_out)
    return [f"<p>{html.escape(text.HELD_OUT_LEDE)}</p>", table, *([f"<p>{html.escape(note)}</p>"] if note else [])]


def _tasks(jobs: Sequence[JobSavings], empty: str) -> str:
    if not jobs:
        return f"<p>{html.escape(empty)}</p>"
    return _table(text.JOB_HEADER, [text.job_cells(job) for job in jobs], text.JOB_NUMERIC)


def _memory(memory: MemoryView) -> list[str]:
    parts = []
    for section in sections(memory):
        lede = f"{section.lede} As of {memory.read_at:%Y-%m-%d %H:%M} UTC."
        parts += [f"<h2>{html.escape(section.title)}</h2>", f"<p>{html.escape(lede)}</p>"]
        table = _table(section.header, section.rows, section.numeric) if section.rows else ""
        parts.append(table or f"<p>{html.escape(section.empty)}</p>")
        parts += [f"<p>{html.escape(more(section))}</p>"] if section.more else []
    return parts


def render_html(report: WeeklyReport, top: int | None = None, memory: MemoryView | None = None) -> str:
    """The whole report as one HTML page; `top` limits the task tables per device kind (None or 0: all listed);
    with `memory`, the fleet's quarantined and slower clusters too."""
    title = f"stitchfleet weekly savings report: {report.week.label}"
    png = base64.b64encode(chart_png(report)).decode("ascii")
    jobs, caption = text.shown_jobs(report, top)
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Week {html.escape(text.span(report))}. {html.escape(text.ROW_COVERS)}</p>",
        f'<img alt="{UNITS[charted_kind(report)]} saved per day and top tasks" src="data:image/png;base64,{png}">',
        "<h2>Fleet totals</h2>",
        _table(["Figure", "Value"], text.totals_cells(report.totals, report.after_check), [False, True]),
        "<h2>Held-out check</h2>",
        *_held_out(report),
        "<h2>Why tasks were reverted</h2>",
        _reasons(report),
    ]
    for dimension in text.DIMENSION_TITLES:
        parts += [f"<h2>By {dimension}</h2>", _rollups(report, dimension)]
    bottom, bottom_caption = text.shown_bottom(report, top)
    parts += [f"<h2>Tasks saving most ({html.escape(caption)})</h2>", _tasks(jobs, "No task ran this week.")]
    parts += [
        f"<h2>Tasks saving least ({html.escape(bottom_caption)})</h2>",
        _tasks(bottom, "Every task of the week is listed above."),
    ]
    parts += _memory(memory) if memory is not None else []
    parts.append(f"<footer>How figures are attributed: {html.escape(report.attribution)}</footer>")
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
        f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
