"""Benchmark: sustained rows per second through the Recorder into a database (not a test).

Input: --db URL (default: a PostgreSQL server started here on loopback with the test fixtures'
helper; or any SQLAlchemy URL), --rows N. Output: prints rows/s from the first record() to the
moment every row is committed, and checks the database holds exactly N windows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stitchfleet import settings
from stitchfleet.telemetry import database, models
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.recorder import Recorder


def _rows(count: int) -> list[r.Row]:
    key = r.JobKey("bench", "bench", "bench", r.new_job_uid())
    now = dt.datetime.now(dt.UTC)
    return [
        r.StepWindow(key, i % 8, i // 8, i, i, 1, "stitched", 0.09, 0.1, 0.01, recorded_at=now) for i in range(count)
    ]


def _bench(url: str, count: int) -> float:
    database.upgrade(url)
    rows = _rows(count)
    with tempfile.TemporaryDirectory() as state:
        current = settings.load({"STITCHFLEET_STATE_DIR": state, "STITCHFLEET_FLUSH_SECONDS": "600"})
        recorder = Recorder(url, settings=current, metrics_port=0, batch_size=1000)
        start = time.perf_counter()
        for row in rows:
            recorder.record(row)
        recorder.close()
        elapsed = time.perf_counter() - start
    engine = database.connect(url)
    with engine.connect() as connection:
        stored = connection.execute(select(func.count(models.StepWindow.id))).scalar_one()
    engine.dispose()
    if stored != count or recorder.stats.spooled:
        raise SystemExit(f"expected {count} rows written, found {stored} ({recorder.stats})")
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a PostgreSQL started here)")
    parser.add_argument("--rows", type=int, default=50_000)
    args = parser.parse_args()
    with ExitStack() as stack:
        url = args.db
        if url is None:
            from tests.telemetry.conftest import create_database, running_server

            url = create_database(stack.enter_context(running_server()))
        rate = _bench(url, args.rows)
    print(f"recorder -> {database.safe_url(url)}: {args.rows} rows, {rate:,.0f} rows/s sustained")


if __name__ == "__main__":
    main()
