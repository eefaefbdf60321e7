"""A training process that records a workload, for the crash test: run as a module, killed by the test.

argv: database URL, spool directory. Protocol on stdout/stdin: prints `half` after the first half
is flushed, waits for a line (the test stops the database), records the rest, prints `spooled`
once it is flushed (to the spool), then waits to be killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from stitchfleet import settings
from stitchfleet.telemetry.recorder import Recorder
from tests.telemetry.workload import workload

FLUSH_SECONDS = 60


def main() -> None:
    url, spool_dir = sys.argv[1], Path(sys.argv[2])
    recorder = Recorder(url, settings=settings.load({}), spool_dir=spool_dir, metrics_port=0, retry_seconds=0.2)
    rows = workload(windows=60, ranks=2)
    half = len(rows) // 2
    for row in rows[:half]:
        recorder.record(row)
    assert recorder.flush(FLUSH_SECONDS)
    print("half", recorder.stats.written, flush=True)
    sys.stdin.readline()
    for row in rows[half:]:
        recorder.record(row)
    assert recorder.flush(FLUSH_SECONDS)
    print("spooled", recorder.stats.spooled, flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
