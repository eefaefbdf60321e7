"""Realistic API bodies for the operator tests: a batch Job, its pods, a bare pod, a TFJob."""

from __future__ import annotations

import copy
from typing import Any

Body = dict[str, Any]
LABELS = {"stitchfleet.io/enabled": "true", "stitchfleet.io/team": "vision", "stitchfleet.io/model": "resnet50"}
JOB_UID = "0d5c2a4e-1111-4e8e-9c1a-5b0c3a7d9e01"


def batch_job(*, name: str = "resnet-train", uid: str = JOB_UID, conditions: list[Body] | None = None) -> Body:
    """A batch/v1 Job with an opted-in template; `conditions` as the Job controller writes them."""
    status: Body = {"startTime": "2026-11-16T08:00:00Z", "active": 2}
    if conditions:
        status = {**status, "active": 0, "conditions": conditions}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": "1"},
        "spec": {
            "parallelism": 2,
            "template": {
                "metadata": {"labels": dict(LABELS)},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "trainer", "image": "tf"}]},
            },
        },
        "status": status,
    }


def job_pod(index: int, *, phase: str = "Running", job: str = "resnet-train", job_uid: str = JOB_UID) -> Body:
    """Pod `index` of the Job as the Job controller creates it and the kubelet reports it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{index}abcd",
            "generateName": f"{job}-",
            "namespace": "ml",
            "uid": f"pod-uid-{job}-{index}",
            "labels": {**LABELS, "job-name": job, "batch.kubernetes.io/job-name": job},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid, "controller": True}
            ],
        },
        "spec": {
            "containers": [
                {"name": "trainer", "image": "tf", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
                {"name": "sidecar", "image": "busybox"},
            ]
        },
        "status": {"phase": "Pending"},
    }
    return with_phase(pod, phase, started=f"2026-11-16T08:0{index}:00Z")


def bare_pod(*, phase: str = "Running") -> Body:
    """A pod created on its own (kubectl run) with a generated name."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "notebook-x7k2p",
            "generateName": "notebook-",
            "namespace": "research",
            "uid": "bare-pod-uid-1",
            "labels": {"stitchfleet.io/enabled": "true"},
        },
        "spec": {"containers": [{"name": "nb", "image": "tf", "resources": {"requests": {"nvidia.com/gpu": 1}}}]},
        "status": {"phase": "Pending"},
    }
    return with_phase(pod, phase, started="2026-11-17T10:00:00Z")


def with_phase(pod: Body, phase: str, *, started: str | None = None, finished: str = "2026-11-16T09:30:00Z") -> Body:
    """The pod in `phase`; terminal phases carry the containers' finish times."""
    result = copy.deepcopy(pod)
    status = result["status"]
    status["phase"] = phase
    if started and phase != "Pending":
        status["startTime"] = started
    if phase in ("Succeeded", "Failed"):
        code = 0 if phase == "Succeeded" else 1
        status["containerStatuses"] = [
            {"name": "trainer", "state": {"terminated": {"exitCode": code, "finishedAt": finished}}},
        ]
    return result


def complete(at: str = "2026-11-16T09:31:00Z") -> list[Body]:
    """The conditions of a batch Job that succeeded."""
    return [{"type": "Complete", "status": "True", "lastTransitionTime": at}]


def failed(at: str = "2026-11-16T09:05:00Z") -> list[Body]:
    """The conditions of a batch Job whose backoff limit was exceeded."""
    return [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": at}]


def tfjob() -> Body:
    """A Kubeflow TFJob with an opted-in Worker template, succeeded."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "bert", "namespace": "nlp", "uid": "tfjob-uid-1"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": {"metadata": {"labels": {"stitchfleet.io/enabled": "true"}}, "spec": {}},
                }
            }
        },
        "status": {
            "completionTime": "2026-11-18T12:00:00Z",
            "conditions": [{"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-11-18T12:00:01Z"}],
        },
    }


MPIJOB_UID = "mpijob-uid-1"
LAUNCHER_JOB_UID = "launcher-job-uid-1"


def mpijob(*, conditions: list[Body] | None = None) -> Body:
    """An MPI operator v2 MPIJob: a Launcher and 2 Workers with 4 GPUs, both templates opted in."""
    labels = {"stitchfleet.io/enabled": "true", "stitchfleet.io/team": "nlp"}
    worker = {"containers": [{"name": "w", "image": "tf", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "bert-mpi", "namespace": "nlp", "uid": MPIJOB_UID, "resourceVersion": "1"},
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"metadata": {"labels": dict(labels)}, "spec": {}}},
                "Worker": {"replicas": 2, "template": {"metadata": {"labels": dict(labels)}, "spec": worker}},
            }
        },
        "status": {"conditions": conditions or []},
    }


def mpi_owner(kind: str = "MPIJob", name: str = "bert-mpi", uid: str = MPIJOB_UID) -> Body:
    """A controller owner reference to the MPIJob (or, with kind Job, to its launcher Job)."""
    api_version = "batch/v1" if kind == "Job" else "kubeflow.org/v2beta1"
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def launcher_job(*, opted_in: bool = True) -> Body:
    """The launcher batch Job the MPI operator creates, owned by the MPIJob."""
    job = batch_job(name="bert-mpi-launcher", uid=LAUNCHER_JOB_UID)
    job["metadata"]["namespace"] = "nlp"
    job["metadata"]["ownerReferences"] = [mpi_owner()]
    if not opted_in:
        job["spec"]["template"]["metadata"]["labels"] = {}
    return job


def mpi_pod(role: str, index: int = 0) -> Body:
    """A running MPIJob pod: the launcher (owned by the launcher Job) or a worker (owned by the MPIJob)."""
    name = f"bert-mpi-{role}-{index}"
    labels = {
        "stitchfleet.io/enabled": "true",
        "stitchfleet.io/team": "nlp",
        "training.kubeflow.org/job-name": "bert-mpi",
        "training.kubeflow.org/job-role": role,
    }
    owner = mpi_owner()
    gpus = "4"
    if role == "launcher":
        labels |= {"job-name": "bert-mpi-launcher", "batch.kubernetes.io/job-name": "bert-mpi-launcher"}
        owner, gpus = mpi_owner("Job", "bert-mpi-launcher", LAUNCHER_JOB_UID), "0"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "nlp",
            "uid": f"pod-uid-{name}",
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {"containers": [{"name": "c", "image": "tf", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": "Pending"},
    }
    return with_phase(pod, "Running", started=f"2026-11-18T10:0{index}:00Z")
