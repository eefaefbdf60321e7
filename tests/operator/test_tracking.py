"""tracking and identity: rows from realistic bodies into a real SQLite ledger; the webhook's JOB_UID matches."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from operator_bodies import JOB_UID, bare_pod, batch_job, complete, failed, job_pod, tfjob, with_phase
from webhook_pods import CONFIG, apply_patch, env_of

from stitchfleet.operator import tracking
from stitchfleet.operator.identity import MalformedPodError, identify
from stitchfleet.operator.injection import mutate
from stitchfleet.telemetry import database, store
from stitchfleet.telemetry.rows import JobFinished, JobStarted


def ledger(tmp_path: Path, rows: list[Any]) -> list[tuple[Any, ...]]:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(url)
    engine = database.connect(url)
    try:
        with engine.begin() as connection:
            store.write_rows(connection, rows)
        with engine.connect() as connection:
            query = "SELECT job_name, job_uid, world_size, gpus_per_rank, status, reason, ended_at FROM jobs"
            return [tuple(row) for row in connection.exec_driver_sql(query)]
    finally:
        engine.dispose()


def test_a_running_job_pod_starts_its_owner_job() -> None:
    (row,) = tracking.pod_rows(job_pod(0), "gpu-east", world_size=2)
    assert isinstance(row, JobStarted)
    assert (row.job.job_name, row.job.job_uid, row.job.namespace) == ("resnet-train", JOB_UID, "ml")
    assert (row.gpus_per_rank, row.world_size, row.rank, row.team) == (4, 2, 1, "vision")
    assert row.started_at == dt.datetime(2026, 11, 16, 8, 0, tzinfo=dt.UTC)


def test_a_pending_pod_records_nothing() -> None:
    assert tracking.pod_rows(job_pod(0, phase="Pending"), "gpu-east") == []


def test_a_failed_pod_of_a_job_is_not_a_failed_job_but_the_job_condition_is(tmp_path: Path) -> None:
    rows = tracking.pod_rows(with_phase(job_pod(0), "Failed"), "gpu-east")
    assert not any(isinstance(row, JobFinished) for row in rows)
    rows += tracking.owner_rows(batch_job(conditions=failed()), "gpu-east")
    assert ledger(tmp_path, rows) == [
        ("resnet-train", JOB_UID, 1, 4, "failed", "BackoffLimitExceeded", "2026-11-16 09:05:00.000000")
    ]


def test_replayed_events_in_any_order_give_the_same_row(tmp_path: Path) -> None:
    events = [*tracking.owner_rows(batch_job(conditions=complete()), "gpu-east")]
    events += tracking.pod_rows(job_pod(1), "gpu-east", world_size=2) + tracking.pod_rows(job_pod(0), "gpu-east")
    got = ledger(tmp_path, [*events, *reversed(events)])
    assert got == [("resnet-train", JOB_UID, 2, 4, "finished", "", "2026-11-16 09:31:00.000000")]


def test_a_bare_pod_is_its_own_job_and_ends_with_its_phase() -> None:
    started, finished = tracking.pod_rows(with_phase(bare_pod(), "Succeeded"), "gpu-east")
    assert (started.job.job_name, started.job.job_uid, started.gpus_per_rank) == ("notebook", "bare-pod-uid-1", 1)
    assert isinstance(finished, JobFinished) and finished.status == "finished"


def test_a_running_bare_pod_deleted_is_a_failed_job() -> None:
    pod = bare_pod()
    pod["metadata"]["deletionTimestamp"] = "2026-11-17T10:30:00Z"
    rows = tracking.pod_rows(pod, "gpu-east", deleted=True)
    assert [(row.status, row.ended_at.hour) for row in rows if isinstance(row, JobFinished)] == [("failed", 10)]


def test_a_tfjob_ends_through_its_kubeflow_condition() -> None:
    (row,) = tracking.owner_rows(tfjob(), "gpu-east")
    assert (row.job.job_name, row.job.job_uid, row.status) == ("bert", "tfjob-uid-1", "finished")
    assert row.ended_at == dt.datetime(2026, 11, 18, 12, 0, tzinfo=dt.UTC)


def test_an_owner_without_opted_in_pods_records_nothing() -> None:
    job = batch_job(conditions=complete())
    job["spec"]["template"]["metadata"]["labels"] = {}
    assert tracking.owner_rows(job, "gpu-east") == []


@pytest.mark.parametrize("pod", [job_pod(0), bare_pod()], ids=["owned", "bare"])
def test_the_webhook_injects_the_job_uid_the_operator_records(pod: dict[str, Any]) -> None:
    admitted = {**pod, "metadata": {k: v for k, v in pod["metadata"].items() if k not in ("uid", "name")}}
    env = env_of(apply_patch(admitted, mutate(admitted, CONFIG).patch)["spec"]["containers"][0])
    key = tracking.pod_job_key(pod, "gpu-east")
    assert key is not None and env["STITCHFLEET_JOB_NAME"] == key.job_name
    if identify(pod["metadata"]).is_bare:
        # The API server assigns the uid after admission: the kubelet resolves it for the pod.
        assert env["STITCHFLEET_JOB_UID"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}
        assert key.job_uid == pod["metadata"]["uid"]
    else:
        assert env["STITCHFLEET_JOB_UID"] == key.job_uid == JOB_UID


def test_a_user_set_job_uid_is_kept() -> None:
    pod = job_pod(0)
    pod["spec"]["containers"][0]["env"] = [{"name": "STITCHFLEET_JOB_UID", "value": "mine"}]
    env = env_of(apply_patch(pod, mutate(pod, CONFIG).patch)["spec"]["containers"][0])
    assert env["STITCHFLEET_JOB_UID"] == "mine"


def test_malformed_owner_references_and_times_are_named() -> None:
    with pytest.raises(MalformedPodError, match="ownerReferences is str"):
        identify({"ownerReferences": "job"})
    pod = job_pod(0)
    pod["status"]["startTime"] = "yesterday"
    with pytest.raises(ValueError, match="'yesterday' is not RFC 3339"):
        tracking.pod_rows(pod, "gpu-east")
