"""Owner chains: which batch Jobs are the launchers of an MPIJob, so their pods are not jobs of their own.

Input: batch Job bodies (from the operator's watch, or fetched by name when a pod names a Job
not seen yet) and pods' owner references. Output: whether the operator ignores a pod because
its Job is an MPIJob's launcher (or is gone), and for a Job, the MPIJob it launches for.

Why: the MPI operator (v2) runs the launcher as a batch Job owned by the MPIJob, while the
workers are owned by the MPIJob directly. Keyed by its direct owner, an opted-in launcher pod
would make a second job row (the Job's uid) next to the MPIJob's, with no GPUs and its own
world size. The launcher runs `mpirun`, not a rank; the MPIJob's own conditions say when the
job ended. So the operator records nothing for a launcher pod or its Job. The webhook cannot do
this resolution (it answers within 5 s with no API calls); see the chart README.

A Job's owner references do not change, so a Job's answer is cached by its uid until the Job
is deleted (memory follows the live Jobs); a fetch happens once per Job the watch has not shown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from stitchfleet.operator.identity import workload_owner

# (group, kind) of owners that run their launcher as a batch Job.
LAUNCHER_PARENTS = {("kubeflow.org", "MPIJob")}
HTTP_NOT_FOUND = 404

JobFetcher = Callable[[str, str], Mapping[str, Any] | None]


def _group(api_version: Any) -> str:
    return str(api_version or "").rpartition("/")[0]


def launcher_parent(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The MPIJob that owns this batch Job (as its controller), else None."""
    owner = workload_owner(job.get("metadata") or {})
    if owner is None or owner.get("controller") is not True:
        return None
    return owner if (_group(owner.get("apiVersion")), owner.get("kind")) in LAUNCHER_PARENTS else None


def _owning_job(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    owner = workload_owner(pod.get("metadata") or {})
    if owner is None or (_group(owner.get("apiVersion")), owner.get("kind")) != ("batch", "Job"):
        return None
    return owner if owner.get("uid") and owner.get("name") else None


class OwnerChains:
    """Launcher Jobs by uid: learnt from Job events, fetched on a miss when a fetcher is given."""

    def __init__(self, fetch_job: JobFetcher | None = None) -> None:
        self._fetch_job = fetch_job
        self._parents: dict[str, dict[str, Any] | None] = {}
        self._lock = threading.Lock()

    def learn(self, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """Remembers a Job's parent (None for a Job of its own); returns it."""
        uid = (job.get("metadata") or {}).get("uid")
        parent = launcher_parent(job)
        if uid:
            with self._lock:
                self._parents[str(uid)] = parent
        return parent

    def forget(self, job: Mapping[str, Any]) -> None:
        """Drops a deleted Job."""
        with self._lock:
            self._parents.pop(str((job.get("metadata") or {}).get("uid")), None)

    def ignores(self, pod: Mapping[str, Any]) -> bool:
        """Whether the operator records nothing for this pod: its Job is an MPIJob's launcher, or gone.

        A pod whose Job is gone (deleted, or re-created under its name) has nothing left to add:
        its start was recorded while the Job lived, and its Job's conditions give the end.
        Without a fetcher, a Job not seen yet counts as a job of its own.
        """
        job = _owning_job(pod)
        if job is None:
            return False
        uid = str(job["uid"])
        with self._lock:
            if uid in self._parents:
                return self._parents[uid] is not None
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        if self._fetch_job is None or not namespace:
            return False
        fetched = self._fetch_job(namespace, str(job["name"]))
        if fetched is None or (fetched.get("metadata") or {}).get("uid") != uid:
            return True
        return self.learn(fetched) is not None


def api_job_fetcher(api_client: Any, *, timeout: float = 10.0) -> JobFetcher:
    """Fetches a batch Job through the kubernetes client (RBAC: get on batch jobs); None on 404.

    A fetch gives up after `timeout` seconds: a handler never waits on a stuck call for long.
    """
    from kubernetes import client

    api = client.BatchV1Api(api_client)

    def fetch(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            job = api.read_namespaced_job(name, namespace, _request_timeout=timeout)
        except client.ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return None
            raise
        body: dict[str, Any] = api_client.sanitize_for_serialization(job)
        return body

    return fetch
