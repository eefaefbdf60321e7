"""What the operator records about opted-in pods and their owners, as telemetry rows.

Input: a Pod, batch Job, TFJob or MPIJob body as the API serves it (a JSON dict) and the cluster
name. Output: `JobStarted` / `JobFinished` rows on the job's natural key (identity.py), which
telemetry's store upserts: earliest start, latest end, worst status, so writing the rows of
every event again (a restart re-lists everything) changes nothing.

Who says a job ended: a bare pod by its own phase; an owned pod's job by its owner's terminal
condition (a batch Job retries failed pods, so one failed pod is not a failed job).
Pods are never written to: everything here reads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from stitchfleet.operator.identity import LABEL_ENABLED, PodIdentity, identify, pod_gpus_per_rank
from stitchfleet.telemetry.models import JobStatus
from stitchfleet.telemetry.rows import JobFinished, JobKey, JobStarted, Row

LABEL_TEAM = "stitchfleet.io/team"
LABEL_MODEL = "stitchfleet.io/model"
# Owners whose pods the operator tracks: (group, kind) -> the label their controller puts on pods.
OWNER_KINDS = {
    ("batch", "Job"): "job-name",
    ("kubeflow.org", "TFJob"): "training.kubeflow.org/job-name",
    ("kubeflow.org", "MPIJob"): "training.kubeflow.org/job-name",
}
TERMINAL_PHASES = {"Succeeded": JobStatus.FINISHED, "Failed": JobStatus.FAILED}
# Condition types that end a workload: batch Job (Complete/Failed), Kubeflow (Succeeded/Failed).
TERMINAL_CONDITIONS = {"Complete": JobStatus.FINISHED, "Succeeded": JobStatus.FINISHED, "Failed": JobStatus.FAILED}


def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 time of the API ('2026-11-16T08:00:00Z') as aware UTC; None when absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"time {value!r} is not RFC 3339") from None
    return parsed.astimezone(dt.UTC) if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def opted_in(labels: Mapping[str, Any] | None) -> bool:
    """Whether these pod labels opt in (exactly what the webhook's objectSelector matches)."""
    return (labels or {}).get(LABEL_ENABLED) == "true"


def pod_job_key(pod: Mapping[str, Any], cluster: str) -> JobKey | None:
    """The job key of a stored pod; None when the pod names no job (nothing to record)."""
    metadata = pod.get("metadata") or {}
    identity = identify(metadata)
    namespace = metadata.get("namespace") or ""
    if not (identity.job_name and identity.job_uid and namespace):
        return None
    return JobKey(cluster, namespace, identity.job_name, identity.job_uid)


def pod_rows(pod: Mapping[str, Any], cluster: str, world_size: int = 1, *, deleted: bool = False) -> list[Row]:
    """Rows for one pod event: started once the pod runs; finished when a bare pod ends.

    `world_size` is the number of the job's pods the operator knows of (the store keeps the
    largest seen; the plugin's own count of ranks, when larger, wins).
    """
    key = pod_job_key(pod, cluster)
    started = parse_time((pod.get("status") or {}).get("startTime"))
    if key is None or started is None:
        return []
    rows: list[Row] = [_started(pod, key, started, max(world_size, 1))]
    if identify(pod.get("metadata") or {}).is_bare:
        rows += _bare_pod_end(pod, key, deleted=deleted)
    return rows


def _started(pod: Mapping[str, Any], key: JobKey, started: dt.datetime, world_size: int) -> JobStarted:
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    # The operator is not a rank: writing as the last one never takes rank 0's pod name.
    return JobStarted(
        key,
        rank=world_size - 1,
        team=str(labels.get(LABEL_TEAM, "")),
        model=str(labels.get(LABEL_MODEL, "")),
        pod_name=str(metadata.get("name", "")),
        world_size=world_size,
        gpus_per_rank=pod_gpus_per_rank(pod.get("spec") or {}),
        started_at=started,
    )


def _bare_pod_end(pod: Mapping[str, Any], key: JobKey, *, deleted: bool) -> list[Row]:
    status = pod.get("status") or {}
    outcome = TERMINAL_PHASES.get(str(status.get("phase")))
    if outcome is not None:
        ended = _last_finish(status) or _last_transition(status.get("conditions"))
        reason = str(status.get("reason") or "") if outcome == JobStatus.FAILED else ""
        return [JobFinished(key, outcome.value, reason, ended_at=ended)] if ended else []
    deleted_at = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deleted and deleted_at is not None:
        return [JobFinished(key, JobStatus.FAILED.value, "pod deleted before it completed", ended_at=deleted_at)]
    return []


def _last_finish(status: Mapping[str, Any]) -> dt.datetime | None:
    times = [
        parse_time(((item.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for item in status.get("containerStatuses") or []
    ]
    known = [time for time in times if time is not None]
    return max(known) if known else None


def _last_transition(conditions: Any) -> dt.datetime | None:
    times = [parse_time(item.get("lastTransitionTime")) for item in conditions or []]
    known = [time for time in times if time is not None]
    return max(known) if known else None


def owner_kind(owner: Mapping[str, Any]) -> tuple[str, str]:
    """(group, kind) of an owner body."""
    group = str(owner.get("apiVersion", "")).rpartition("/")[0]
    return group, str(owner.get("kind", ""))


def pod_templates(owner: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod templates of a batch Job, TFJob (tfReplicaSpecs) or MPIJob (mpiReplicaSpecs)."""
    spec = owner.get("spec") or {}
    if "template" in spec:
        return [spec["template"] or {}]
    replicas = spec.get("tfReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}
    return [(replica or {}).get("template") or {} for replica in replicas.values()]


def owner_opted_in(owner: Mapping[str, Any]) -> bool:
    """Whether any pod template of this owner carries the opt-in label."""
    return any(opted_in((template.get("metadata") or {}).get("labels")) for template in pod_templates(owner))


def owner_identity(owner: Mapping[str, Any]) -> PodIdentity:
    """The identity its pods get: the same rule applied to the metadata a pod of it would carry."""
    metadata = owner.get("metadata") or {}
    labels: dict[str, Any] = {}
    for template in pod_templates(owner):
        template_labels = (template.get("metadata") or {}).get("labels") or {}
        if opted_in(template_labels):
            labels = dict(template_labels)
            break
    controller_label = OWNER_KINDS.get(owner_kind(owner))
    if controller_label:
        labels[controller_label] = metadata.get("name", "")
    name, uid = metadata.get("name"), metadata.get("uid")
    reference = {"kind": owner.get("kind"), "name": name, "uid": uid, "controller": True}
    return identify({"labels": labels, "ownerReferences": [reference]})


def owner_rows(owner: Mapping[str, Any], cluster: str) -> list[Row]:
    """A JobFinished row once the owner has a terminal condition; nothing before."""
    metadata = owner.get("metadata") or {}
    identity = owner_identity(owner)
    namespace = metadata.get("namespace") or ""
    if not (owner_opted_in(owner) and identity.job_uid and identity.job_name and namespace):
        return []
    status = owner.get("status") or {}
    for condition in status.get("conditions") or []:
        outcome = TERMINAL_CONDITIONS.get(str(condition.get("type")))
        if outcome is None or condition.get("status") != "True":
            continue
        ended = parse_time(status.get("completionTime")) or parse_time(condition.get("lastTransitionTime"))
        if ended is None:
            continue
        key = JobKey(cluster, namespace, identity.job_name, identity.job_uid)
        reason = str(condition.get("reason") or "") if outcome == JobStatus.FAILED else ""
        return [JobFinished(key, outcome.value, reason, ended_at=ended)]
    return []
