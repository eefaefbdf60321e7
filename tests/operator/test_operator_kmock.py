"""The real kopf operator, in-process, against kmock (a Kubernetes API emulator with watch streams).

A Job's pods appear, run and finish; the jobs table of a real SQLite telemetry database gets the
job's rows; the operator is stopped mid-way and a new one started: nothing is doubled or lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import kopf
import pytest
from operator_bodies import bare_pod, batch_job, complete, job_pod, with_phase
from sqlalchemy import select

from stitchfleet.operator import handlers, process
from stitchfleet.telemetry import database, models
from stitchfleet.telemetry.fleet_metrics import FleetMetrics
from stitchfleet.telemetry.recorder import Recorder

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]
PODS = "v1/pods"
JOBS = "batch/v1/jobs"
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
WAIT_SECONDS = 20.0


def declare(api: kmock.KubernetesEmulator) -> None:
    api.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs={"list", "watch", "get", "patch"})
    api.resources[JOBS] = kmock.ResourceInfo(kind="Job", namespaced=True, verbs={"list", "watch", "get", "patch"})
    # kopf waits for namespaces in the discovery, even cluster-wide (a real API server has them).
    api.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs={"list", "watch"})
    # kopf watches the CRDs to notice resources appearing (Kubeflow's, here absent).
    api.resources[CRDS] = kmock.ResourceInfo(kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch"})


def put(api: kmock.KubernetesEmulator, resource: str, body: dict[str, Any]) -> None:
    """Stores an object as the cluster would have it (listed and streamed by kmock)."""
    api.objects[resource, body["metadata"]["namespace"], body["metadata"]["name"]] = body


async def change(api: kmock.KubernetesEmulator, resource: str, body: dict[str, Any]) -> None:
    """Replaces an object through the API, so that watchers get a MODIFIED event."""
    meta = body["metadata"]
    path = resource.replace("v1/", "v1/namespaces/" + meta["namespace"] + "/", 1)
    prefix = "/api/" if resource.startswith("v1/") else "/apis/"
    import aiohttp

    async with aiohttp.ClientSession() as session:
        response = await session.patch(
            f"{str(api.url).rstrip('/')}{prefix}{path}/{meta['name']}",
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert response.status == 200, await response.text()


@contextlib.asynccontextmanager
async def operator(api: kmock.KubernetesEmulator, url: str, spool: Path) -> AsyncIterator[Recorder]:
    """One life of the operator; yields its recorder (flush it before reading the database)."""
    from stitchfleet import settings

    recorder = Recorder(url, settings=settings.load({}), spool_dir=spool, metrics_port=0)
    context = handlers.OperatorContext("gpu-east", recorder, FleetMetrics())
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(lambda **_: kopf.ConnectionInfo(server=str(api.url).rstrip("/")))
    handlers.build_registry(context, registry)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(process.operate(context, registry, stop_flag=stop, ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), WAIT_SECONDS)
        yield recorder
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_SECONDS)
        recorder.close()


def jobs_table(url: str) -> list[tuple[Any, ...]]:
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            job = models.Job
            query = select(
                job.namespace,
                job.job_name,
                job.job_uid,
                job.world_size,
                job.gpus_per_rank,
                job.team,
                job.started_at,
                job.ended_at,
                job.status,
            ).order_by(job.namespace, job.job_name)
            return [tuple(row) for row in connection.execute(query)]
    finally:
        engine.dispose()


async def until(recorder: Recorder, url: str, check: Callable[[list[tuple[Any, ...]]], bool]) -> list[tuple[Any, ...]]:
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        recorder.flush(5.0)
        rows = jobs_table(url)
        if check(rows) or asyncio.get_running_loop().time() > deadline:
            return rows
        await asyncio.sleep(0.2)


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_job_pods_finish_and_a_restart_neither_doubles_nor_loses(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(url)
    declare(kmock)
    put(kmock, JOBS, batch_job())
    put(kmock, PODS, job_pod(0))
    put(kmock, PODS, bare_pod())
    async with operator(kmock, url, tmp_path / "spool-1") as recorder:
        rows = await until(recorder, url, lambda rows: len(rows) == 2)
        assert [(r[0], r[1], r[3], r[4], r[5], r[8]) for r in rows] == [
            ("ml", "resnet-train", 1, 4, "vision", "running"),
            ("research", "notebook", 1, 1, "", "running"),
        ]
        put(kmock, PODS, job_pod(1))
        await change(kmock, PODS, job_pod(1))
        rows = await until(recorder, url, lambda rows: rows[0][3] == 2)
        assert rows[0][3] == 2, "the second pod widens the job"
        # The bare pod ends: its own phase is the job's outcome.
        await change(kmock, PODS, with_phase(bare_pod(), "Succeeded", finished="2026-11-17T11:00:00Z"))
        rows = await until(recorder, url, lambda rows: rows[1][8] == "finished")
        assert rows[1][7] == utc("2026-11-17T11:00:00Z")
    before = jobs_table(url)
    # While the operator is down, the Job completes (one failed pod was retried: not a failed job).
    await change(kmock, PODS, with_phase(job_pod(0), "Failed"))
    await change(kmock, JOBS, batch_job(conditions=complete("2026-11-16T09:31:00Z")))
    async with operator(kmock, url, tmp_path / "spool-2") as recorder:
        rows = await until(recorder, url, lambda rows: rows[0][8] == "finished")
    assert len(rows) == 2, "a restart re-lists everything and doubles nothing"
    assert rows[0][1:] == (*before[0][1:7], utc("2026-11-16T09:31:00Z"), "finished")
    assert rows[1] == before[1], "the bare pod's end survives the restart unchanged"
    assert rows[0][6] == utc("2026-11-16T08:00:00Z"), "the earliest pod start is the job's start"
