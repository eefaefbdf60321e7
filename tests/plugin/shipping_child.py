"""A pod's training process that ships telemetry, for the SIGKILL test: run as a module, killed by the test.

argv: spool directory. Environment: the STITCHFLEET_INGEST_* settings of an injected pod.
Protocol on stdout/stdin: ships the first half of a workload and prints `half` once the
operator acknowledged it; waits for a line (the test swaps the token and holds the API
server's TokenReview); records the second half and starts shipping it (`shipping` is printed
first), then waits to be killed mid-batch.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from stitchfleet import settings
from stitchfleet.plugin.fleet.ingest_client import Endpoint, IngestClient
from stitchfleet.plugin.fleet.shipper import Shipper
from tests.telemetry.workload import workload

FLUSH_SECONDS = 60


def main() -> None:
    spool_dir = Path(sys.argv[1])
    client = IngestClient(Endpoint.from_settings(settings.load()))
    # A long interval: only the explicit flushes below ship, so the test knows when.
    shipper = Shipper(spool_dir, client, batch_rows=40, interval=3600)
    rows = workload(windows=60, ranks=2)
    half = len(rows) // 2
    for row in rows[:half]:
        shipper.record(row)
    assert shipper.flush(FLUSH_SECONDS)
    print("half", shipper.stats.shipped, flush=True)
    sys.stdin.readline()
    for row in rows[half:]:
        shipper.record(row)
    print("shipping", flush=True)
    threading.Thread(target=shipper.flush, args=(FLUSH_SECONDS,), daemon=True).start()
    time.sleep(600)


if __name__ == "__main__":
    main()
