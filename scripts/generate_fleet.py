"""Writes a synthetic fleet week into a telemetry database (dev and demo data, not a test).

Input: --db URL (default: STITCHFLEET_DB_URL or the SQLite file in the state dir), --tasks N
(default 70,000, the AStitch paper's weekly scale), --week 2026-W47, --seed S, --no-bulk (every
row through the store's upserts, as the recorder writes them; the default bulk load uses COPY on
PostgreSQL and builds the incremental rollups from the rows in memory). Output: the rows in the database,
progress on stderr, and a one-line summary; then `stitchfleet report weekly --week ...` reads it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stitchfleet.telemetry import database, synthetic, weeks


def show_progress(done: int, total: int) -> None:
    """One self-overwriting progress line on stderr."""
    end = "\n" if done == total else ""
    print(f"\r  {done:>9,} / {total:,} tasks ({done / total:.0%})", end=end, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
    parser.add_argument("--tasks", type=int, default=70_000)
    parser.add_argument("--week", default="2026-W47", help="ISO week, e.g. 2026-W47")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-bulk", action="store_true", help="write job rows through the store's upserts too")
    args = parser.parse_args()
    try:
        spec = synthetic.FleetSpec(tasks=args.tasks, week=weeks.parse_week(args.week), seed=args.seed)
    except ValueError as err:
        parser.error(str(err))
    url = database.resolve_url(args.db)
    start = time.perf_counter()
    try:
        rows = synthetic.generate(url, spec, bulk=not args.no_bulk, progress=show_progress)
    except Exception as err:  # a driver can fail in many ways: one line, no traceback
        print(f"generate_fleet: {database.describe_failure(url, err)}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    print(f"{spec.tasks:,} tasks, {rows:,} rows for {spec.week.label} -> {database.safe_url(url)} in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
