"""Which job a pod belongs to: one rule shared by the admission webhook and the operator.

Input: a pod's metadata (and spec, for GPUs) as a JSON dict, as the webhook sees it at CREATE
time or as the operator sees it on a watch. Output: a `PodIdentity`: the job name and the job
uid, i.e. the `job_name` and `job_uid` of telemetry's natural key (see telemetry/models.py).

The rule (the webhook injects STITCHFLEET_JOB_UID with it; the operator writes the same key):
- a pod with an owner (the controller owner first: batch Job, TFJob, MPIJob...) belongs to that
  owner: job uid = the owner's uid, known at admission because the controller sets the owner
  reference on the pod it creates. Retries of a Job's pods share the Job's row; a re-created Job
  has a new uid, hence a new row.
- a bare pod is its own job: job uid = the pod's own uid. At admission the API server has not
  assigned it yet (nor the generated name), so the webhook injects it through the downward API
  (fieldRef metadata.uid) rather than as a literal: the value never depends on generateName.
The job name: label stitchfleet.io/job, else the Job/Kubeflow job-name labels, else the owner's
name, else generateName without its trailing '-', else the pod's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LABEL_ENABLED = "stitchfleet.io/enabled"
LABEL_JOB = "stitchfleet.io/job"
# The job's own label first, then what the Job controller and Kubeflow's training operator set.
JOB_NAME_LABELS = (LABEL_JOB, "job-name", "batch.kubernetes.io/job-name", "training.kubeflow.org/job-name")
GPU_RESOURCE = "nvidia.com/gpu"


class MalformedPodError(ValueError):
    """The pod does not have the shape of a Pod where the identity or the patch needs it."""


@dataclass(frozen=True)
class PodIdentity:
    """A pod's job: `job_uid` is None for a bare pod not yet stored (admission time)."""

    job_name: str
    job_uid: str | None
    owner_kind: str = ""

    @property
    def is_bare(self) -> bool:
        """Whether the pod is its own job (no owner)."""
        return not self.owner_kind


def identify(metadata: Mapping[str, Any]) -> PodIdentity:
    """The job of the pod with this metadata (see the module docstring for the rule)."""
    labels = metadata.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise MalformedPodError(f"metadata.labels is {type(labels).__name__}, expected an object")
    owner = workload_owner(metadata)
    name = _label_name(labels) or (str(owner["name"]) if owner else "") or _own_name(metadata)
    if owner is not None:
        return PodIdentity(name, str(owner.get("uid") or "") or None, str(owner.get("kind") or "Owner"))
    uid = metadata.get("uid")
    return PodIdentity(name, uid if isinstance(uid, str) and uid else None)


def workload_owner(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner reference the pod's job is: the controller owner, else the first named owner."""
    owners = metadata.get("ownerReferences") or []
    if not isinstance(owners, list):
        raise MalformedPodError(f"metadata.ownerReferences is {type(owners).__name__}, expected a list")
    for index, owner in enumerate(owners):
        if not isinstance(owner, dict):
            raise MalformedPodError(f"metadata.ownerReferences[{index}] is {type(owner).__name__}, expected an object")
    # The controller owner is the workload (Job, TFJob...); other owners are incidental.
    for owner in sorted(owners, key=lambda ref: ref.get("controller") is not True):
        if isinstance(owner.get("name"), str) and owner["name"]:
            return dict(owner)
    return None


def _label_name(labels: Mapping[str, Any]) -> str:
    for label in JOB_NAME_LABELS:
        value = labels.get(label)
        if isinstance(value, str) and value:
            return value
    return ""


def _own_name(metadata: Mapping[str, Any]) -> str:
    generate_name = metadata.get("generateName")
    if isinstance(generate_name, str) and generate_name.strip("-"):
        return generate_name.rstrip("-")
    name = metadata.get("name")
    return name if isinstance(name, str) else ""


def gpu_count(value: Any) -> int | None:
    """A resource quantity of GPUs as an int; None when it is not a whole count."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        return None
    return int(text)


def pod_gpus_per_rank(spec: Mapping[str, Any]) -> int:
    """The most GPUs any one container of the pod asks for (limits, else requests); 0 without GPUs."""
    most = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        count = gpu_count(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0)))
        most = max(most, count or 0)
    return most
