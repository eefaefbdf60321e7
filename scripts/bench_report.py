"""Benchmark: generate a synthetic fleet week, then time the weekly report (figures, not a test).

Input: --tasks N (default 70,000), --week, --seed, --backend sqlite|postgresql|both (PostgreSQL:
a server started here on loopback with the test fixtures' helper), or --db URL for an existing
database; --scan also times the from-scratch summary (O(rows), the old path) for comparison.
Output: per backend, the rows and seconds to generate the week (bulk load, aggregates included),
the database size, the seconds of `weekly_summary` (cold and warm), of the operator's rollup (CPU
seconds of its thread, and of the PostgreSQL backend that served it), of rendering Markdown, HTML
and the rollups CSV and their sizes, of `stitchfleet report weekly --format csv` streaming every
task to a file (its size, and the command's peak resident memory), and the headline figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generate_fleet import show_progress  # this script's folder (sys.path[0] when run)

from stitchfleet.operator.rollup import Rollup
from stitchfleet.operator.savings import ledger_summarizer
from stitchfleet.telemetry import database, report_html, report_text, savings, savings_scan, synthetic, weeks
from stitchfleet.telemetry.fleet_metrics import FleetMetrics

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def timed(label: str, action: Callable[[], Any]) -> Any:
    """Runs `action`, prints how long it took, returns its result."""
    start = time.perf_counter()
    result = action()
    print(f"  {label:<40} {time.perf_counter() - start:8.3f} s", flush=True)
    return result


def _database_size(url: str, engine: Any) -> str:
    if url.startswith("sqlite"):
        path = Path(engine.url.database)
        total = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        return f"{total / 1e6:,.0f} MB (file, WAL included)"
    with engine.connect() as connection:
        size = connection.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one()
    return f"{size / 1e6:,.0f} MB (pg_database_size)"


def _backend_cpu(engine: Any) -> Callable[[], float]:
    """CPU seconds (user + system) of the PostgreSQL backend serving `engine`'s single pooled connection."""
    with engine.connect() as connection:
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

    def read() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    return read


def bench_rollup(url: str, spec: synthetic.FleetSpec) -> None:
    """The operator's periodic rollup (current and previous week), three runs, CPU seconds each."""
    engine = database.connect(url, pool_size=1, max_overflow=0) if "postgresql" in url else database.connect(url)
    backend = _backend_cpu(engine) if "postgresql" in url else None
    now = spec.week.start + dt.timedelta(days=6, hours=12)
    rollup = Rollup(ledger_summarizer(engine), lambda week, status: None, FleetMetrics(), clock=lambda: now)
    try:
        for attempt in range(3):
            server = backend() if backend else 0.0
            rollup.run_once()
            served = f", PostgreSQL backend {backend() - server:.3f} CPU s" if backend else ""
            print(
                f"  operator rollup run {attempt + 1} (2 weeks)            {rollup.last_wall_seconds:8.3f} s wall, "
                f"{rollup.last_cpu_seconds:.3f} CPU s (operator thread){served}"
            )
    finally:
        engine.dispose()


def bench_csv(url: str, week: weeks.Week, folder: Path) -> None:
    """`stitchfleet report weekly --format csv` (every task) into a file, in a child process: its time,
    the file's size and the child's peak resident memory (what streaming costs, whatever the fleet)."""
    target = folder / "jobs.csv"
    command = [sys.executable, "-m", "stitchfleet.cli", "report", "weekly", "--db", url, "--week", week.label]
    command += ["--format", "csv", "--output", str(target)]
    root = str(Path(__file__).resolve().parents[1])
    timed("jobs csv (the CLI, a child process)", lambda: subprocess.run(command, check=True, cwd=root))
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e3  # kilobytes on Linux
    print(f"  jobs csv: {target.stat().st_size / 1e6:,.1f} MB; peak RSS of the command {peak:,.0f} MB")


def bench(url: str, spec: synthetic.FleetSpec, folder: Path, scan: bool) -> None:
    """Generates into `url` and times the report; prints figures."""
    print(f"{database.safe_url(url)}: {spec.tasks:,} tasks, week {spec.week.label}, seed {spec.seed}")
    rows = timed("generate (bulk load + aggregates)", lambda: synthetic.generate(url, spec, progress=show_progress))
    engine = database.connect(url)
    print(f"  rows written {rows:,}; database {_database_size(url, engine)}")
    engine.dispose()
    report = timed("weekly_summary (aggregates)", lambda: savings.weekly_summary(url, spec.week))
    timed("weekly_summary again (warm)", lambda: savings.weekly_summary(url, spec.week))
    if scan:
        timed("weekly_summary_scan (every row, old path)", lambda: savings_scan.weekly_summary_scan(url, spec.week))
    bench_rollup(url, spec)
    markdown = timed("render markdown", lambda: report_text.render_markdown(report))
    page = timed("render html", lambda: report_html.render_html(report))
    rollups = timed("render csv (rollups)", lambda: report_text.rollups_csv(report))
    sizes = f"markdown {len(markdown.encode()) / 1e3:.1f} KB, html {len(page.encode()) / 1e3:.1f} KB"
    print(f"  sizes: {sizes}, rollups csv {len(rollups.encode()) / 1e3:.1f} KB")
    bench_csv(url, spec.week, folder)
    t = report.totals
    print(f"  tasks {t.tasks:,}, distributed {t.distributed_tasks / t.tasks:.1%}, jobs {t.jobs:,}")
    for kind in t.by_kind:
        hours = f"gross {kind.gross_hours:,.0f}, compile {kind.compile_hours:,.0f}, net {kind.net_hours:,.0f}"
        print(f"  {kind.unit} saved ({kind.tasks:,} {kind.device_kind} tasks): {hours}")
    print(f"  reverted {t.reverted_share:.1%}: {[(r.reason, r.tasks, r.reverts) for r in t.revert_reasons]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=70_000)
    parser.add_argument("--week", default="2026-W47")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="sqlite")
    parser.add_argument("--db", default=None, help="an existing, empty database URL instead of --backend")
    parser.add_argument("--scan", action="store_true", help="also time the from-scratch summary (slow at scale)")
    args = parser.parse_args()
    spec = synthetic.FleetSpec(tasks=args.tasks, week=weeks.parse_week(args.week), seed=args.seed)
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stitchfleet-bench-")))
        if args.db:
            bench(args.db, spec, folder, args.scan)
            return
        if args.backend in ("sqlite", "both"):
            bench(f"sqlite:///{folder}/fleet.db", spec, folder, args.scan)
        if args.backend in ("postgresql", "both"):
            from tests.telemetry.conftest import create_database, running_server

            bench(create_database(stack.enter_context(running_server())), spec, folder, args.scan)


if __name__ == "__main__":
    main()
