"""The ingestion endpoint in process: pods' rows over HTTPS, TokenReview, attribution, idempotence, quarantine.

The real webhook server and IngestService on loopback, kmock as the API server (TokenReview from
ingest_harness.TokenApi, pods as kmock objects), SQLite; the pod side is the plugin's own
IngestClient. Every row that arrives is compared with the same rows written straight into a
reference database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from pathlib import Path

import kmock
import pytest
from chart_rbac import api_calls, denied
from ingest_harness import (
    CLUSTER,
    NAMESPACE,
    Endpoint,
    TokenApi,
    add_pod,
    as_shipped,
    declare_pods,
    job_pod,
    pod_settings,
    serving,
)

from stitchfleet.operator.ingest import QUARANTINE, ROWS, own
from stitchfleet.operator.pod_jobs import PodJob
from stitchfleet.plugin.fleet.ingest_client import DeliveryError, IngestClient
from stitchfleet.plugin.fleet.ingest_client import Endpoint as ClientEndpoint
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.slow_verdicts import Remembered
from tests.telemetry.test_recorder import reference_figures
from tests.telemetry.workload import figures, workload

pytestmark = pytest.mark.timeout(120)
POD, POD_UID = "resnet-train-0-x7k2p", "pod-uid-1"


@pytest.fixture
def tokens(kmock: kmock.KubernetesEmulator) -> TokenApi:
    declare_pods(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "resnet-train", "run-1"))
    add_pod(kmock, job_pod("research", "notebook-0", "pod-uid-2", "notebook", "run-9"))
    api = TokenApi()
    api.serve(kmock)
    return api


def client_for(endpoint: Endpoint, tmp_path: Path, token: str) -> IngestClient:
    token_file = tmp_path / f"token-{abs(hash(token))}"
    token_file.write_text(token + "\n")
    current = pod_settings(endpoint.port, endpoint.ca_pem, token_file, tmp_path / "state")
    return IngestClient(ClientEndpoint.from_settings(current))


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'telemetry.db'}"


@pytest.mark.asyncio
async def test_a_pods_rows_land_as_its_jobs_and_a_replay_doubles_nothing(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    rows = workload(windows=30, ranks=2)
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        pod = client_for(endpoint, tmp_path, tokens.issue("vision", POD, POD_UID))
        for start in range(0, len(rows), 25):
            assert await asyncio.to_thread(pod.post_rows, rows[start : start + 25]) == len(rows[start : start + 25])
        once = figures(endpoint.url)
        assert await asyncio.to_thread(pod.post_rows, rows[:25]) == 25  # a batch whose answer was lost
        assert await asyncio.to_thread(pod.post_rows, rows) == len(rows)  # the whole spool again
        assert figures(endpoint.url) == once == reference_figures(as_shipped(rows, POD), tmp_path)
        assert endpoint.service.reviewer.reviews == 1  # one TokenReview for the pod's many batches
        metrics = endpoint.metrics()
    stitched = sum(w.iterations for w in rows if isinstance(w, r.StepWindow) and w.mode == "stitched")
    assert (
        f'stitchfleet_job_iterations{{job="resnet-train",mode="stitched",namespace="vision"}} {stitched}.0' in metrics
    )
    assert 'stitchfleet_job_reverts{job="resnet-train",namespace="vision"} 1.0' in metrics
    assert denied(api_calls(kmock), "stitchfleet", NAMESPACE) == []  # tokenreviews create, pods get


def moved_to(namespace: str, row: r.Row) -> r.Row:
    if isinstance(row, r.ClusterVerdict):
        return row
    return dataclasses.replace(row, job=dataclasses.replace(row.job, namespace=namespace))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_token_of_another_namespace_is_refused_and_nothing_is_written(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    rows = workload(windows=5, ranks=1)
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        other = client_for(endpoint, tmp_path, tokens.issue("research", "notebook-0", "pod-uid-2"))
        with pytest.raises(DeliveryError) as refused:
            await asyncio.to_thread(other.post_rows, rows)
        assert refused.value.status == 403
        assert "research/notebook-0 may not write rows of job vision/resnet-train" in str(refused.value)
        # Nothing of the batch; only the refusal, recorded as an event of the caller's own job.
        assert figures(endpoint.url)["jobs"] == [("run-9", "running", 0.0, "", 1)]
        assert figures(endpoint.url)["events"] == 1
        # The same job uid under the caller's own namespace is still another job's uid: refused.
        moved = [moved_to("research", row) for row in rows]
        with pytest.raises(DeliveryError, match="403"):
            await asyncio.to_thread(other.post_rows, moved)
        assert figures(endpoint.url)["jobs"] == [("run-9", "running", 0.0, "", 1)]  # whole batch refused
        assert figures(endpoint.url)["verdicts"] == [] and figures(endpoint.url)["events"] == 1  # one a minute
        assert 'stitchfleet_ingest_refused_total{status="403"} 2.0' in endpoint.metrics()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("issue", "reason"),
    [
        (lambda t: t.issue("vision", POD, POD_UID, audience="https://kubernetes.default.svc"), "not authenticated"),
        (lambda t: "never-issued", "not authenticated"),
        (lambda t: t.issue("vision", POD, "uid-of-an-earlier-pod"), "not the pod the token was issued to"),
        (lambda t: t.issue("vision", "gone-0", "uid-3"), "does not exist"),
    ],
    ids=["api-server-audience", "unknown", "reused-pod-name", "deleted-pod"],
)
async def test_tokens_that_name_no_live_pod_of_ours_are_refused(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path, issue: object, reason: str
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        pod = client_for(endpoint, tmp_path, issue(tokens))  # type: ignore[operator]
        with pytest.raises(DeliveryError) as refused:
            await asyncio.to_thread(pod.post_rows, workload(windows=1, ranks=1))
        assert refused.value.status == 401 and reason in str(refused.value)
        with pytest.raises(DeliveryError, match="401"):
            await asyncio.to_thread(pod.quarantined)
        assert figures(endpoint.url)["jobs"] == []


@pytest.mark.asyncio
async def test_malformed_requests_get_their_reason(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        token = tokens.issue("vision", POD, POD_UID)
        call = endpoint.call
        bearer = f"Bearer {token}"
        assert (await asyncio.to_thread(call, "POST", ROWS, "", b"{}"))[0] == 401
        assert (await asyncio.to_thread(call, "POST", ROWS, bearer, b"not json"))[0] == 400
        bad_row = json.dumps({"rows": [{"type": "StepWindow", "iterations": 0}]}).encode()
        status, answer = await asyncio.to_thread(call, "POST", ROWS, bearer, bad_row)
        assert status == 400 and "rows[0]" in answer["error"]
        too_many = json.dumps({"rows": [{}] * 5001}).encode()
        assert (await asyncio.to_thread(call, "POST", ROWS, bearer, too_many))[0] == 413
        assert (await asyncio.to_thread(call, "DELETE", ROWS, bearer, b""))[0] == 404


@pytest.mark.asyncio
async def test_the_quarantine_is_the_fleets_reverted_clusters(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        pod = client_for(endpoint, tmp_path, tokens.issue("vision", POD, POD_UID))
        assert await asyncio.to_thread(pod.quarantined) == set()
        await asyncio.to_thread(pod.post_rows, workload(windows=4, ranks=1))  # reverts fp-ln-bwd, enables fp-gelu
        assert await asyncio.to_thread(pod.quarantined) == {"fp-ln-bwd"}
        status, _ = await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, "Bearer x")
        assert status == 401


@pytest.mark.asyncio
@pytest.mark.parametrize("outcome", ["slower", "faster"])
async def test_the_quarantine_answers_speed_verdicts_of_two_jobs_never_of_one(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path, outcome: str
) -> None:
    """Slower and faster verdicts reach pods through the operator by the same rule (a pod behind the operator
    skips a probe the fleet already answered either way); each in its own list."""
    now = dt.datetime.now(dt.UTC)
    vision_job = r.JobKey(CLUSTER, "vision", "resnet-train", "run-1")
    research_job = r.JobKey(CLUSTER, "research", "notebook", "run-9")
    other = "faster" if outcome == "slower" else "slower"

    def finding(job: r.JobKey) -> r.ProbeVerdict:
        return r.ProbeVerdict(job, "fp-gelu", "cpu:Xeon x8", "f32[8,768]", outcome, "0.4 ms/step", now)

    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        vision = client_for(endpoint, tmp_path, tokens.issue("vision", POD, POD_UID))
        research = client_for(endpoint, tmp_path, tokens.issue("research", "notebook-0", "pod-uid-2"))
        assert await asyncio.to_thread(vision.post_rows, [finding(vision_job)]) == 1
        assert await asyncio.to_thread(vision.recall) == Remembered()  # one job's finding decides nothing
        with pytest.raises(DeliveryError, match="403"):  # nor can a pod add evidence in another job's name
            await asyncio.to_thread(research.post_rows, [finding(dataclasses.replace(vision_job, job_uid="run-2"))])
        assert await asyncio.to_thread(research.post_rows, [finding(research_job)]) == 1
        memory = await asyncio.to_thread(research.recall)
        [verdict] = getattr(memory, outcome)
        assert memory.reverted == frozenset() and getattr(memory, other) == ()
        assert verdict.key == ("fp-gelu", "cpu:Xeon x8", "f32[8,768]") and verdict.jobs == 2
        assert verdict.outcome == outcome and verdict.expires == now + dt.timedelta(days=7)
        assert await asyncio.to_thread(vision.quarantined) == set()  # what an old pod reads still reads
        token = tokens.issue("vision", POD, POD_UID)
        status, answer = await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, f"Bearer {token}")
        assert status == 200 and answer == {"reverted": [], outcome: [verdict.to_json()], other: []}


def test_rows_are_attributed_from_the_token_never_the_body() -> None:
    job = PodJob("vision", "resnet-train-0-x7k2p", "resnet-train", "run-1")
    claimed = r.JobKey("elsewhere", "vision", "renamed-by-the-pod", "run-1")
    started = own(r.JobStarted(claimed, pod_name="someone-else"), job, CLUSTER)
    assert isinstance(started, r.JobStarted)
    assert started.job == r.JobKey(CLUSTER, "vision", "resnet-train", "run-1")
    assert started.pod_name == "resnet-train-0-x7k2p"
    verdict = r.ClusterVerdict("fp", "reverted", reason="mismatch")
    # A pod's verdict is its job's evidence, whatever it claims: never the fleet's standing.
    assert own(verdict, job, CLUSTER) == r.JobVerdict(
        r.JobKey(CLUSTER, "vision", "resnet-train", "run-1"), "fp", "reverted", "mismatch", None, verdict.updated_at
    )


@pytest.mark.asyncio
async def test_pods_their_author_grouped_into_one_job_write_for_that_job(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    # The pod's author set STITCHFLEET_JOB_UID (the webhook keeps it): its rows are that job's.
    grouped = job_pod("vision", "sweep-3", "pod-uid-3", "sweep", "owner-uid")
    grouped["spec"]["containers"][0]["env"] = [{"name": "STITCHFLEET_JOB_UID", "value": "sweep-run-7"}]
    add_pod(kmock, grouped)
    key = r.JobKey(CLUSTER, "vision", "sweep", "sweep-run-7")
    rows = [r.JobStarted(key), r.StepWindow(key, 0, 0, 0, 9, 10, "stitched", 1.0)]
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        pod = client_for(endpoint, tmp_path, tokens.issue("vision", "sweep-3", "pod-uid-3"))
        assert await asyncio.to_thread(pod.post_rows, rows) == 2
        owner_key = dataclasses.replace(key, job_uid="owner-uid")  # the owner's uid is not what the pod says
        with pytest.raises(DeliveryError, match="403"):
            await asyncio.to_thread(pod.post_rows, [r.JobStarted(owner_key)])
        assert [job[0] for job in figures(endpoint.url)["jobs"]] == ["sweep-run-7"]  # type: ignore[union-attr]
