"""Bad data from an authenticated pod: a 400 naming the field, on SQLite and PostgreSQL alike, never a 503.

The real server and IngestService with kmock; each case is one JobStarted (or other row) whose JSON
breaks one rule: a bool or a float where an integer goes, an integer past its column, a NaN, a NUL,
an over-long string, a wrong type for a key's part. Before issue 31 these were 503s (PostgreSQL: out of
range, NUL; NaN op_count), `rank: 1.5` was stored (1.5 on SQLite, 2 on PostgreSQL) and `true` was
a rank. The answer never names the database; a database that is down is a bare 503.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import kmock
import pytest

from stitchfleet.operator.ingest import ROWS
from stitchfleet.telemetry import rows as r
from tests.operator.ingest_harness import CLUSTER, TokenApi, add_pod, declare_pods, job_pod, serving
from tests.telemetry.conftest import create_database, running_server
from tests.telemetry.workload import figures

pytestmark = pytest.mark.timeout(180)
POD, POD_UID = "train-0", "pod-uid-1"
KEY = r.JobKey(CLUSTER, "vision", "train", "run-1")
STARTED = r.to_json(r.JobStarted(KEY, pod_name=POD))
VERDICT = r.to_json(r.ClusterVerdict("fp", "reverted"))


def changed(row: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**row, **fields}


CASES = [
    (changed(STARTED, rank=True), "JobStarted.rank: True (bool), expected an integer"),
    (changed(STARTED, rank=1.5), "JobStarted.rank: 1.5 (float), expected an integer"),
    (changed(STARTED, world_size=2**31), "JobStarted.world_size: 2147483648 is outside"),
    (changed(STARTED, gpus_per_rank=-(2**63)), "JobStarted.gpus_per_rank: -9223372036854775808 is outside"),
    (changed(STARTED, team="ml\x00"), "JobStarted.team: contains a NUL character"),
    (changed(STARTED, model="m" * 129), "JobStarted.model: 129 characters, at most 128"),
    (changed(STARTED, job={**STARTED["job"], "namespace": 7}), "JobStarted.job.namespace: int, expected a string"),
    (changed(STARTED, started_at="yesterday"), "JobStarted.started_at: 'yesterday' is not an ISO 8601 time"),
    (changed(VERDICT, op_count=float("nan")), "ClusterVerdict.op_count: nan (float), expected an integer"),
    (changed(VERDICT, fingerprint="f" * 65), "ClusterVerdict.fingerprint: 65 characters, at most 64"),
    ({"type": ["JobStarted"]}, "unknown row type"),
]


@pytest.fixture
def token(kmock: kmock.KubernetesEmulator) -> str:
    declare_pods(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "train", "run-1"))
    api = TokenApi()
    api.serve(kmock)
    return api.issue("vision", POD, POD_UID)


@pytest.mark.asyncio
async def test_each_bad_field_is_a_400_naming_it_and_nothing_is_written(
    kmock: kmock.KubernetesEmulator, token: str, any_url: str, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", any_url) as endpoint:
        for row, words in CASES:
            body = json.dumps({"rows": [STARTED, row]}).encode()
            status, answer = await asyncio.to_thread(endpoint.call, "POST", ROWS, f"Bearer {token}", body)
            assert (status, words) == (400, words) and words in answer["error"], (row, answer)
            assert answer["error"].startswith("rows[1]: ")
        stored = figures(endpoint.url)
        # Nothing of the batches: the job's row holds only the refusal's event (one a minute).
        assert stored["jobs"] == [("run-1", "running", 0.0, "", 1)] and stored["events"] == 1
        status, _ = await asyncio.to_thread(
            endpoint.call, "POST", ROWS, f"Bearer {token}", json.dumps({"rows": [STARTED]}).encode()
        )
        assert status == 200  # and the good row alone is stored
        assert [job[0] for job in figures(endpoint.url)["jobs"]] == ["run-1"]  # type: ignore[attr-defined]


@pytest.mark.asyncio
@pytest.mark.postgres
@pytest.mark.slow
async def test_a_database_that_is_down_is_a_bare_503_naming_nothing_of_it(
    kmock: kmock.KubernetesEmulator, token: str, tmp_path: Path
) -> None:
    with running_server() as server:
        url = create_database(server)
        async with serving(kmock, tmp_path / "tls", url) as endpoint:
            server.stop()
            body = json.dumps({"rows": [STARTED]}).encode()
            status, answer = await asyncio.to_thread(endpoint.call, "POST", ROWS, f"Bearer {token}", body)
            assert status == 503 and answer == {"error": "the telemetry database is unavailable; retry later"}
            server.start()
