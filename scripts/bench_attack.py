"""Benchmark: the operator's server under issue 31's attacks, its peak memory and its legitimate answers (not a test).

Input: --attack mutate|ingest|drip|all, --tree DIR (the source tree whose server runs: this one by
default; an export of another commit measures it the same way). Each attack runs against a fresh
server process (the real WebhookServer and IngestService of that tree; TokenReview and the pod read
are in-process fakes that accept one token; SQLite): `mutate` = 10 concurrent 8 MiB AdmissionReviews
without auth, `ingest` = 60 concurrent unauthenticated 8 MiB bodies on /ingest/v1/rows, `drip` = 300
connections sending their headers a byte a second. Meanwhile a pod asks the quarantine and the API
server sends a small review every 0.5 s. Output: per attack, the server's RSS before and its peak
(VmHWM), its peak thread count, and the legitimate requests answered (and their worst latency).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
GOOD = "good-token"
HOST = "stitchfleet.stitchfleet-system.svc"
MIB = 1024 * 1024


def serve(work: Path) -> None:
    """The child: the tree's server on loopback; prints its port, then serves until killed."""
    from prometheus_client import CollectorRegistry

    from stitchfleet.operator.ingest import IngestService
    from stitchfleet.operator.injection import InjectionConfig
    from stitchfleet.operator.pod_jobs import PodJobs
    from stitchfleet.operator.tls import ensure_self_signed
    from stitchfleet.operator.token_review import POD_NAME, POD_UID, TokenReviewer
    from stitchfleet.operator.webhook_server import WebhookServer
    from stitchfleet.telemetry import database
    from stitchfleet.telemetry.batch_writer import BatchWriter
    from stitchfleet.telemetry.job_metrics import JobMetrics

    def review(token: str, audiences: list[str]) -> dict[str, object]:
        time.sleep(0.005)  # an API server round trip
        if token != GOOD:
            return {"authenticated": False, "error": "invalid bearer token"}
        extra = {POD_NAME: ["pod-0"], POD_UID: ["pod-uid-0"]}
        user = {"username": "system:serviceaccount:vision:default", "extra": extra}
        return {"authenticated": True, "user": user, "audiences": audiences}

    def pod(namespace: str, name: str) -> dict[str, object]:
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid", "controller": True}
        metadata = {"name": name, "namespace": namespace, "uid": "pod-uid-0", "ownerReferences": [owner]}
        return {"metadata": metadata, "spec": {"containers": [{"name": "t"}]}}

    url = f"sqlite:///{work / 'telemetry.db'}"
    database.upgrade(url)
    ensure_self_signed(work / "tls", "stitchfleet", "stitchfleet-system")
    service = IngestService(
        "bench", TokenReviewer(review, "stitchfleet"), PodJobs(pod), BatchWriter(url), JobMetrics(CollectorRegistry())
    )
    server = WebhookServer(
        InjectionConfig(cluster="bench", shim_image="unused"), work / "tls", host="127.0.0.1", port=0, ingest=service
    )
    server.start()
    print(server.port, flush=True)
    while True:
        time.sleep(3600)


def status_of(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "Threads"):
            fields[name] = int(value.split()[0])
    return fields


def review_body(pod_bytes: int) -> bytes:
    """An AdmissionReview whose pod carries `pod_bytes` of small annotations (parses into many objects)."""
    annotations = {f"a{index:07d}": "v" for index in range(pod_bytes // 17)}  # '"a0000000": "v", ' each
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "annotations": annotations}, "spec": {}}
    request = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE", "object": pod}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


class Target:
    def __init__(self, port: int, ca: str) -> None:
        self.port = port
        self.context = ssl.create_default_context(cadata=ca)

    def connect(self, timeout: float = 60.0) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.context.wrap_socket(raw, server_hostname=HOST)

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        connection.sock = self.connect(timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()


def legitimate(target: Target, stop: threading.Event, results: list[tuple[str, int, float]]) -> None:
    """A pod's quarantine read and the API server's small review, every 0.5 s, each with a 10 s timeout."""
    small = review_body(2000)
    while not stop.is_set():
        for what, method, path, body, headers in (
            ("pod", "GET", "/ingest/v1/quarantine", None, {"Authorization": f"Bearer {GOOD}"}),
            ("admission", "POST", "/mutate", small, {"Content-Type": "application/json"}),
        ):
            started = time.monotonic()
            try:
                status = target.request(method, path, body, headers, 10.0)
            except (OSError, http.client.HTTPException):
                status = 0
            results.append((what, status, time.monotonic() - started))
        stop.wait(0.5)


def attack_bodies(target: Target, count: int, path: str, body: bytes) -> None:
    def one() -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):
            target.request("POST", path, body, {"Content-Type": "application/json"}, 60.0)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def attack_drip(target: Target, count: int, seconds: float) -> None:
    sockets = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            sockets.append(target.connect(5.0))
    line = b"POST /ingest/v1/rows HTTP/1.1\r\nHost: x\r\nX-Drip: " + b"a" * 1000
    started, sent = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        for tls in sockets:
            with contextlib.suppress(OSError):
                tls.sendall(line[sent % len(line) : sent % len(line) + 1])
        sent += 1
        time.sleep(1.0)
    print(f"  drip: {len(sockets)} of {count} connections opened", flush=True)
    for tls in sockets:
        with contextlib.suppress(OSError):
            tls.close()


def run(attack: str, tree: Path) -> None:
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        child = subprocess.Popen(
            [sys.executable, str(HERE), "--serve", work],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # one log line per dropped connection under attack
            text=True,
        )
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline())
            target = Target(port, (Path(work) / "tls" / "ca.crt").read_text())
            before = status_of(child.pid)
            peak = dict(before)
            stop, results = threading.Event(), []  # type: ignore[var-annotated]
            watcher = threading.Thread(target=legitimate, args=(target, stop, results))
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.is_set():
                    with contextlib.suppress(OSError):
                        now = status_of(child.pid)
                        peak["Threads"] = max(peak["Threads"], now["Threads"])
                        peak["VmHWM"] = now["VmHWM"]
                    sampling.wait(0.1)

            sampler = threading.Thread(target=sample)
            sampler.start()
            watcher.start()
            started = time.monotonic()
            if attack == "mutate":
                attack_bodies(target, 10, "/mutate", review_body(8 * MIB - 2000))
            elif attack == "ingest":
                attack_bodies(target, 60, "/ingest/v1/rows", b'{"rows": [' + b" " * (8 * MIB - 12) + b"]}")
            else:
                attack_drip(target, 300, 20.0)
            took = time.monotonic() - started
            time.sleep(1.0)
            stop.set()
            watcher.join()
            sampling.set()
            sampler.join()
            alive = child.poll() is None
            for what in ("pod", "admission"):
                mine = [(status, seconds) for name, status, seconds in results if name == what]
                answered = [seconds for status, seconds in mine if status == 200]
                worst = max(answered) if answered else float("nan")
                print(f"  {what}: {len(answered)} of {len(mine)} answered 200, slowest {worst:.2f} s")
            print(
                f"{attack}: {took:.1f} s; RSS {before['VmRSS'] / 1024:.0f} MiB before, peak {peak['VmHWM'] / 1024:.0f}"
                f" MiB; threads {before['Threads']} before, peak {peak['Threads']}; server alive: {alive}",
                flush=True,
            )
        finally:
            child.kill()
            child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attack", choices=["mutate", "ingest", "drip", "all"], default="all")
    parser.add_argument("--tree", type=Path, default=HERE.parents[1])
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    for attack in ("mutate", "ingest", "drip") if args.attack == "all" else (args.attack,):
        run(attack, args.tree.resolve())


if __name__ == "__main__":
    main()
