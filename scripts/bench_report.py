"""Benchmark: generate a synthetic fleet week, then time the weekly report (figures, not a test).

Input: --tasks N (default 70,000), --week, --seed, --backend sqlite|postgresql|both (PostgreSQL:
a server started here on loopback with the test fixtures' helper), or --db URL for an existing
database. Output: per backend, the seconds to generate the week, to compute `weekly_summary`, and
to render it as Markdown, CSV (jobs and rollups) and HTML, and the report's headline figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.generate_fleet import show_progress
from stitchfleet.telemetry import database, report_html, report_text, savings, synthetic, weeks


def timed(label: str, action: Callable[[], Any]) -> Any:
    """Runs `action`, prints how long it took, returns its result."""
    start = time.perf_counter()
    result = action()
    print(f"  {label:<28} {time.perf_counter() - start:8.2f} s", flush=True)
    return result


def bench(url: str, spec: synthetic.FleetSpec) -> None:
    """Generates into `url` and times the report; prints figures."""
    print(f"{database.safe_url(url)}: {spec.tasks:,} tasks, week {spec.week.label}, seed {spec.seed}")
    rows = timed("generate (bulk job rows)", lambda: synthetic.generate(url, spec, progress=show_progress))
    report = timed("weekly_summary (SQL + sums)", lambda: savings.weekly_summary(url, spec.week))
    timed("weekly_summary again (warm)", lambda: savings.weekly_summary(url, spec.week))
    markdown = timed("render markdown", lambda: report_text.render_markdown(report))
    jobs_csv = timed("render csv (jobs)", lambda: report_text.jobs_csv(report))
    timed("render csv (rollups)", lambda: report_text.rollups_csv(report))
    page = timed("render html (top 500 tasks)", lambda: report_html.render_html(report, top=500))
    t = report.totals
    print(f"  rows written {rows:,}; tasks {t.tasks:,}, distributed {t.distributed_tasks / t.tasks:.1%}")
    for kind in t.by_kind:
        hours = f"gross {kind.gross_hours:,.0f}, compile {kind.compile_hours:,.0f}, net {kind.net_hours:,.0f}"
        print(f"  {kind.unit} saved ({kind.tasks:,} {kind.device_kind} tasks): {hours}")
    print(f"  reverted {t.reverted_share:.1%}: {[(r.reason, r.tasks, r.reverts) for r in t.revert_reasons]}")
    sizes = f"markdown {len(markdown) / 1e6:.1f} MB, csv {len(jobs_csv) / 1e6:.1f} MB, html {len(page) / 1e6:.1f} MB"
    print(f"  sizes: {sizes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=70_000)
    parser.add_argument("--week", default="2026-W47")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="sqlite")
    parser.add_argument("--db", default=None, help="an existing, empty database URL instead of --backend")
    args = parser.parse_args()
    spec = synthetic.FleetSpec(tasks=args.tasks, week=weeks.parse_week(args.week), seed=args.seed)
    if args.db:
        bench(args.db, spec)
        return
    with ExitStack() as stack:
        if args.backend in ("sqlite", "both"):
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="stitchfleet-bench-"))
            bench(f"sqlite:///{folder}/fleet.db", spec)
        if args.backend in ("postgresql", "both"):
            from tests.telemetry.conftest import create_database, running_server

            bench(create_database(stack.enter_context(running_server())), spec)


if __name__ == "__main__":
    main()
