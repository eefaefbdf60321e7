"""Benchmark: rows per second through the operator's ingestion endpoint into a database (not a test).

Input: --db URL (default: a PostgreSQL server started here on loopback with the test fixtures'
helper), --rows N per pass, --pods P (concurrent clients, one job each), --batch B rows per request.
The endpoint is the real webhook server with the real IngestService (HTTPS, TokenReview through the
kubernetes client against kmock, pods read from kmock, the store's upserts), in this process; the
clients are the plugin's own IngestClient, one thread per pod. Output: rows/s from the first request
to the last acknowledgement and each request's p50/p99 seconds, for a first pass and for a replay of
the same rows (idempotent: the database must then hold exactly N windows, which is checked).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import kmock
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stitchfleet.plugin.fleet.ingest_client import DeliveryError, Endpoint, IngestClient
from stitchfleet.telemetry import database, models
from stitchfleet.telemetry import rows as r
from tests.operator.ingest_harness import TokenApi, add_pod, declare_pods, job_pod, pod_settings, serving


def _rows(pod: int, count: int) -> list[r.Row]:
    key = r.JobKey("gpu-east", "bench", f"job-{pod}", f"uid-{pod}")
    now = dt.datetime.now(dt.UTC)
    return [
        r.StepWindow(key, i % 8, i // 8, i, i, 1, "stitched", 0.09, 0.1, 0.01, recorded_at=now) for i in range(count)
    ]


class Cluster:
    """kmock (API server with TokenReview and the pods) and the endpoint, on a loop in a thread."""

    def __init__(self, url: str, pods: int, tls_dir: Path) -> None:
        self.url, self.pods, self.tls_dir = url, pods, tls_dir
        self.ready = threading.Event()
        self.done: asyncio.Event | None = None
        self.loop = asyncio.new_event_loop()
        self.tokens = TokenApi()
        self.port, self.ca_pem = 0, ""
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        self.done = asyncio.Event()
        async with kmock.KubernetesEmulator() as api, kmock.Server(api):
            declare_pods(api)
            self.tokens.serve(api)
            for pod in range(self.pods):
                add_pod(api, job_pod("bench", f"pod-{pod}", f"pod-uid-{pod}", f"job-{pod}", f"uid-{pod}"))
            async with serving(api, self.tls_dir, self.url) as endpoint:
                self.port, self.ca_pem = endpoint.port, endpoint.ca_pem
                self.ready.set()
                await self.done.wait()

    def __enter__(self) -> Cluster:
        self.thread.start()
        if not self.ready.wait(60):
            raise SystemExit("the endpoint did not start within 60 s")
        return self

    def __exit__(self, *_: object) -> None:
        assert self.done is not None
        self.loop.call_soon_threadsafe(self.done.set)
        self.thread.join(30)


def _client(cluster: Cluster, pod: int, directory: Path) -> IngestClient:
    token = directory / f"token-{pod}"
    token.write_text(cluster.tokens.issue("bench", f"pod-{pod}", f"pod-uid-{pod}"))
    current = pod_settings(cluster.port, cluster.ca_pem, token, directory / f"state-{pod}")
    return IngestClient(Endpoint.from_settings(current))


def _pass(clients: list[IngestClient], rows: list[list[r.Row]], batch: int) -> tuple[float, list[float]]:
    """Seconds for the pass, and each request's seconds (a refused or failed request is retried, as the
    pod's Shipper would, and its latency counts to the acknowledgement)."""
    latencies: list[float] = []

    def ship(index: int) -> None:
        mine = rows[index]
        for start in range(0, len(mine), batch):
            sent = time.perf_counter()
            while True:
                try:
                    clients[index].post_rows(mine[start : start + batch])
                    break
                except DeliveryError:
                    time.sleep(0.5)
            latencies.append(time.perf_counter() - sent)

    began = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(ship, range(len(clients))))
    return time.perf_counter() - began, latencies


def _percentiles(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {ordered[-1]:.2f} s over {len(ordered)} requests"


def _windows(url: str) -> int:
    engine = database.connect(url)
    with engine.connect() as connection:
        stored = connection.execute(select(func.count(models.StepWindow.id))).scalar_one()
    engine.dispose()
    return int(stored)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a PostgreSQL started here)")
    parser.add_argument("--rows", type=int, default=40_000, help="rows per pass, split over the pods")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500, help="rows per request (the plugin's default)")
    args = parser.parse_args()
    with ExitStack() as stack:
        url = args.db
        if url is None:
            from tests.telemetry.conftest import create_database, running_server

            url = create_database(stack.enter_context(running_server()))
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cluster = stack.enter_context(Cluster(url, args.pods, directory / "tls"))
        clients = [_client(cluster, pod, directory) for pod in range(args.pods)]
        rows = [_rows(pod, args.rows // args.pods) for pod in range(args.pods)]
        total = sum(len(mine) for mine in rows)
        first, first_latencies = _pass(clients, rows, args.batch)
        replay, replay_latencies = _pass(clients, rows, args.batch)
        stored = _windows(url)
        if stored != total:
            raise SystemExit(f"expected {total} windows in the database, found {stored}")
    where = database.safe_url(url)
    print(f"ingest endpoint -> {where}: {args.pods} pods, {args.batch} rows/request, {total} rows")
    print(f"  first pass: {total / first:,.0f} rows/s ({total / args.batch / first:,.1f} requests/s)")
    print(f"    {_percentiles(first_latencies)}")
    print(f"  replay of the same rows: {total / replay:,.0f} rows/s; database still holds {stored} windows")
    print(f"    {_percentiles(replay_latencies)}")


if __name__ == "__main__":
    main()
