"""An MPIJob v2 with an opted-in launcher is one job, not two: the operator resolves Job -> MPIJob.

The real kopf operator in-process against kmock, with the owner chains fetching Jobs through
the real kubernetes client. The launcher pod is owned by a batch Job that the MPIJob owns; the
workers are owned by the MPIJob. Only the MPIJob's row may appear, ended by its own condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
from kubernetes import client
from operator_bodies import MPIJOB_UID, launcher_job, mpi_pod, mpijob, with_phase
from operator_process import declare_cluster
from sqlalchemy import select

from stitchfleet import settings
from stitchfleet.operator import handlers, process
from stitchfleet.operator.owners import OwnerChains, api_job_fetcher
from stitchfleet.telemetry import database, models
from stitchfleet.telemetry.fleet_metrics import FleetMetrics
from stitchfleet.telemetry.recorder import Recorder

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio]
WAIT_SECONDS = 20.0
SETTLE_SECONDS = 1.5
PODS, JOBS, MPIJOBS = "v1/pods", "batch/v1/jobs", "kubeflow.org/v2beta1/mpijobs"
LAUNCHER_JOB_PATH = "/apis/batch/v1/namespaces/nlp/jobs/bert-mpi-launcher"
MPIJOB_ROW = ("bert-mpi", MPIJOB_UID, 2, 4, "nlp")


def seed(api: kmock.KubernetesEmulator, *, launcher_opted_in: bool) -> None:
    """The MPIJob as the MPI operator has made it: launcher Job, launcher pod, two workers."""
    api.objects[MPIJOBS, "nlp", "bert-mpi"] = mpijob()
    api.objects[JOBS, "nlp", "bert-mpi-launcher"] = launcher_job(opted_in=launcher_opted_in)
    for pod in (mpi_pod("launcher"), mpi_pod("worker", 0), mpi_pod("worker", 1)):
        api.objects[PODS, "nlp", pod["metadata"]["name"]] = pod


@contextlib.asynccontextmanager
async def operator(api: kmock.KubernetesEmulator, url: str, spool: Path) -> AsyncIterator[Recorder]:
    """One life of the operator, with owner chains that fetch Jobs from kmock."""
    configuration = client.Configuration()
    configuration.host = str(api.url).rstrip("/")
    api_client = client.ApiClient(configuration)
    owners = OwnerChains(api_job_fetcher(api_client))
    recorder = Recorder(url, settings=settings.load({}), spool_dir=spool, metrics_port=0)
    context = handlers.OperatorContext("gpu-east", recorder, FleetMetrics(), owners=owners)
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(lambda **_: kopf.ConnectionInfo(server=configuration.host))
    handlers.build_registry(context, registry)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(process.operate(context, registry, stop_flag=stop, ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), WAIT_SECONDS)
        yield recorder
    finally:
        # Its idle keep-alive connection would hold a kmock task that kopf's shutdown waits 5 s on.
        api_client.close()
        stop.set()
        await asyncio.wait_for(task, WAIT_SECONDS)
        recorder.close()


def jobs_table(url: str) -> list[tuple[Any, ...]]:
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            job = models.Job
            query = select(job.job_name, job.job_uid, job.world_size, job.gpus_per_rank, job.team, job.status)
            return [tuple(row) for row in connection.execute(query.order_by(job.job_name))]
    finally:
        engine.dispose()


async def until(recorder: Recorder, url: str, check: Callable[[list[tuple[Any, ...]]], bool]) -> list[tuple[Any, ...]]:
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        await asyncio.to_thread(recorder.flush, 5.0)
        rows = jobs_table(url)
        if check(rows) or asyncio.get_running_loop().time() > deadline:
            return rows
        await asyncio.sleep(0.2)


async def call(api: kmock.KubernetesEmulator, method: str, path: str, body: Any = None) -> None:
    """A request through kmock's HTTP API, so that watchers see the change."""
    headers = {"Content-Type": "application/merge-patch+json"}
    async with aiohttp.ClientSession() as session:
        response = await session.request(method, f"{str(api.url).rstrip('/')}{path}", json=body, headers=headers)
        assert response.status == 200, await response.text()


async def settle(recorder: Recorder) -> None:
    """Gives the operator time to handle the last change (nothing observable is to appear), then flushes."""
    await asyncio.sleep(SETTLE_SECONDS)
    await asyncio.to_thread(recorder.flush, 5.0)


def fetches(api: kmock.KubernetesEmulator) -> int:
    return len(list(api[f"get {LAUNCHER_JOB_PATH}"]))


async def test_a_launcher_job_seen_only_by_fetching_adds_no_job(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(url)
    declare_cluster(kmock)
    seed(kmock, launcher_opted_in=False)  # its template lacks the label: no Job event, a fetch decides
    async with operator(kmock, url, tmp_path / "spool") as recorder:
        rows = await until(recorder, url, lambda rows: any(row[2] == 2 for row in rows))
        assert rows == [(*MPIJOB_ROW, "running")], "the launcher pod made no job of its own"
        assert fetches(kmock) == 1, "one fetch resolved the launcher Job; later events use the cache"
        succeeded = [{"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-11-18T12:00:00Z"}]
        await call(
            kmock, "PATCH", "/apis/kubeflow.org/v2beta1/namespaces/nlp/mpijobs/bert-mpi", mpijob(conditions=succeeded)
        )
        rows = await until(recorder, url, lambda rows: rows[0][5] == "finished")
        assert rows == [(*MPIJOB_ROW, "finished")]
        # The MPI operator deletes the launcher Job; its pod ends after: still nothing of its own.
        await call(kmock, "DELETE", LAUNCHER_JOB_PATH)
        ended = with_phase(copy.deepcopy(mpi_pod("launcher")), "Succeeded", finished="2026-11-18T12:00:00Z")
        await call(kmock, "PATCH", "/api/v1/namespaces/nlp/pods/bert-mpi-launcher-0", ended)
        await settle(recorder)
    assert jobs_table(url) == [(*MPIJOB_ROW, "finished")]


async def test_an_opted_in_launcher_job_completing_ends_nothing(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(url)
    declare_cluster(kmock)
    seed(kmock, launcher_opted_in=True)
    async with operator(kmock, url, tmp_path / "spool") as recorder:
        rows = await until(recorder, url, lambda rows: any(row[2] == 2 for row in rows))
        assert rows == [(*MPIJOB_ROW, "running")]
        complete = [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-11-18T11:00:00Z"}]
        job = launcher_job()
        job["status"] = {"conditions": complete, "completionTime": "2026-11-18T11:00:00Z"}
        await call(kmock, "PATCH", LAUNCHER_JOB_PATH, job)
        await settle(recorder)
    assert jobs_table(url) == [(*MPIJOB_ROW, "running")], "the launcher Job completing ended nothing"
