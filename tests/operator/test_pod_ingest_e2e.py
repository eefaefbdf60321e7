"""A pod as it really is: TensorFlow and numpy only, shipping to a running `stitchfleet operator` into PostgreSQL.

The training process runs an ordinary TF1 script (tests/plugin/user_script.py) in a virtualenv
holding only numpy and TensorFlow (pod_venv.py), with stitchfleet present only as the boot shim's
copy (`stitchfleet shim install DIR`, the init container's command), started the way the webhook
starts an opted-in pod: the shim on PYTHONPATH and the injected STITCHFLEET_* variables, among
them the ingestion endpoint, its CA and a projected-token file. The operator is the real child
process against kmock; kmock 0.8 has no TokenReview of its own, so ingest_harness.TokenApi serves
it (as the API server answers for projected tokens). The database is a real PostgreSQL.
The job's windows are found in the database; a token of another namespace is refused; every API
call the operator made (TokenReview included) is one the chart's RBAC grants.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from chart_rbac import api_calls, denied
from ingest_harness import HOSTNAME, TokenApi, add_pod, job_pod
from operator_process import (
    NAMESPACE,
    Ports,
    child_environment,
    declare_cluster,
    http_get,
    operator_process,
    stop,
    write_kubeconfig,
)
from pod_venv import ABSENT, missing_modules, pod_venv
from sqlalchemy import select

from stitchfleet.operator.ingest import BASE
from stitchfleet.plugin.fleet.ingest_client import DeliveryError, Endpoint, IngestClient
from stitchfleet.telemetry import database, models
from stitchfleet.telemetry import rows as r
from tests.shared_cache import kernel_cache
from tests.telemetry.conftest import create_database, running_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.tf, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "plugin" / "user_script.py"
STEPS = 30
POD, POD_UID, JOB_UID = "resnet-train-0-x7k2p", "pod-uid-e2e", "job-uid-e2e"


@pytest.fixture(scope="session")
def venv_python() -> Path:
    python = pod_venv()
    assert sorted(missing_modules(python)) == sorted(ABSENT), "the pod venv must hold only numpy and TensorFlow"
    return python


@pytest.fixture
def pg_url() -> Iterator[str]:
    with running_server() as server:
        yield create_database(server)


def pod_environment(shim: Path, state: Path, port: int, ca_pem: str, token_file: Path) -> dict[str, str]:
    """What the webhook injects (ingest_harness names the certificate's host), nothing of the test's."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(state),
        "PYTHONPATH": str(shim / "shim"),
        "STITCHFLEET_ENABLED": "1",
        "STITCHFLEET_CLUSTER": "gpu-east",
        "STITCHFLEET_NAMESPACE": "vision",
        "STITCHFLEET_POD_NAME": POD,
        "STITCHFLEET_JOB_NAME": "resnet-train",
        "STITCHFLEET_JOB_UID": JOB_UID,
        "STITCHFLEET_STATE_DIR": str(state),
        "STITCHFLEET_INGEST_URL": f"https://127.0.0.1:{port}{BASE}",
        "STITCHFLEET_INGEST_CA": ca_pem,
        "STITCHFLEET_INGEST_SERVER_NAME": HOSTNAME,  # the Service's name, which the cert carries
        "STITCHFLEET_INGEST_TOKEN_FILE": str(token_file),
        "STITCHFLEET_CACHE_DIR": str(kernel_cache()),
        "STITCHFLEET_WARMUP_STEPS": "2",
        "STITCHFLEET_BASELINE_STEPS": "4",
        "STITCHFLEET_PROBE_STEPS": "3",
        "STITCHFLEET_WINDOW_STEPS": "10",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }


def windows_of(url: str) -> list[tuple[Any, ...]]:
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            job, window = models.Job, models.StepWindow
            query = select(job.cluster, job.namespace, job.job_name, job.job_uid, job.pod_name, window.iterations)
            return [tuple(row) for row in connection.execute(query.join(window))]
    finally:
        engine.dispose()


def train(python: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), str(SCRIPT), str(STEPS)], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.asyncio
async def test_a_tensorflow_only_pod_ships_its_windows_through_the_operator(
    kmock: kmock.KubernetesEmulator, venv_python: Path, pg_url: str, tmp_path: Path
) -> None:
    declare_cluster(kmock)
    tokens = TokenApi()
    tokens.serve(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "resnet-train", JOB_UID))
    add_pod(kmock, job_pod("research", "notebook-0", "pod-uid-other", "notebook", "job-uid-other"))
    shim = tmp_path / "opt"
    subprocess.run([sys.executable, "-m", "stitchfleet.cli", "shim", "install", str(shim)], check=True, timeout=120)
    ports = Ports.pick()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))
    env = child_environment(tmp_path, ports, kubeconfig, STITCHFLEET_DB_URL=pg_url)
    async with operator_process(env, tmp_path / "operator.log") as run:
        await run.eventually(lambda: http_get(ports.health, "/healthz"), "/healthz answer", 60)
        ca_pem = (tmp_path / "tls" / "ca.crt").read_text()
        token_file = tmp_path / "token"
        token_file.write_text(tokens.issue("vision", POD, POD_UID))
        state = tmp_path / "pod-state"
        pod_env = pod_environment(shim, state, ports.webhook, ca_pem, token_file)
        done = await asyncio.to_thread(train, venv_python, pod_env, tmp_path)
        assert done.returncode == 0, done.stderr[-4000:]
        assert f"trained: {STEPS}" in done.stdout
        assert "telemetry is off" not in done.stderr and "not delivered" not in done.stderr, done.stderr[-3000:]

        windows = windows_of(pg_url)
        assert windows, f"no windows in PostgreSQL; pod stderr:\n{done.stderr[-3000:]}\n{run.log_tail()}"
        assert {w[:5] for w in windows} == {("gpu-east", "vision", "resnet-train", JOB_UID, POD)}
        assert sum(w[5] for w in windows) == STEPS  # every training step, once
        assert list((state / "spool").glob("*.jsonl")) == []  # all delivered

        other = tmp_path / "other-token"
        other.write_text(tokens.issue("research", "notebook-0", "pod-uid-other"))
        intruder = IngestClient(Endpoint.from_settings(_client_settings(pod_env, other)))
        forged = r.StepWindow(
            r.JobKey("gpu-east", "vision", "resnet-train", JOB_UID), 0, 999, 0, 9, 10, "stitched", 1.0
        )
        with pytest.raises(DeliveryError) as refused:
            await asyncio.to_thread(intruder.post_rows, [forged])
        assert refused.value.status == 403
        assert sum(w[5] for w in windows_of(pg_url)) == STEPS  # nothing of the forged row

        assert await stop(run.child, 20) == 0
    assert "Traceback" not in (tmp_path / "operator.log").read_text(errors="replace")
    calls = api_calls(kmock)
    assert any(call.resource == "tokenreviews" and call.verb == "create" for call in calls)
    assert denied(calls, "stitchfleet", NAMESPACE) == []


def _client_settings(pod_env: dict[str, str], token_file: Path) -> Any:
    from stitchfleet import settings

    values = {k: v for k, v in pod_env.items() if k.startswith("STITCHFLEET_INGEST_")}
    return settings.load({**values, "STITCHFLEET_INGEST_TOKEN_FILE": str(token_file)})
