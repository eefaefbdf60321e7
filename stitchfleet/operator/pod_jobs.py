"""The job a verified pod may write rows for, from the pod as the API server stores it.

Input: a `PodCaller` (from a TokenReview) and a way to read a pod (GET pods/{namespace}/{name}).
Output: a `PodJob`: the namespace, pod name and the job's name and uid: the literal
STITCHFLEET_JOB_UID / STITCHFLEET_JOB_NAME in the pod's spec (what the webhook injected, or what
the pod's author set to group pods into one job: the webhook never overrides it), else the rule the
webhook and the operator share (identity.py). Nothing comes from the request body: the token says
which pod, the API server's copy of that pod says which job; the process in the pod cannot change
either. A pod whose uid differs from the token's (a
new pod of the same name) or that is gone is refused. Answers are cached by pod uid (bounded) for
`ttl` seconds: a pod's owner never changes, but a deleted pod must stop writing soon after.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stitchfleet.operator.identity import MalformedPodError, identify
from stitchfleet.operator.token_review import PodCaller, ReviewUnavailable, Unauthenticated

HTTP_NOT_FOUND = 404

# (namespace, name) -> the pod as a JSON dict, None when it does not exist; raises when the API fails.
PodFetcher = Callable[[str, str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class PodJob:
    """Whose rows a caller may write: the job (namespace, name, uid) of its pod."""

    namespace: str
    pod_name: str
    job_name: str
    job_uid: str


def api_pod_fetcher(api_client: Any, timeout: float) -> PodFetcher:
    """A PodFetcher through the kubernetes client (the operator may already get pods)."""
    from kubernetes import client

    api = client.CoreV1Api(api_client)

    def fetch(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            pod = api.read_namespaced_pod(name, namespace, _request_timeout=timeout)
        except client.ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return None
            raise ReviewUnavailable(f"reading pod {namespace}/{name}: {err.status} {err.reason}") from None
        except Exception as err:
            raise ReviewUnavailable(f"reading pod {namespace}/{name}: {type(err).__name__}: {err}") from None
        return dict(api_client.sanitize_for_serialization(pod))

    return fetch


def spec_literal(spec: Mapping[str, Any], name: str) -> str:
    """The literal value of env var `name` in the pod's first container that sets one ("" if none).

    Only literals: a valueFrom (fieldRef to the pod's uid, a ConfigMap) is resolved by the kubelet
    and not visible here; the identity rule gives the same answer for the webhook's fieldRef.
    """
    for container in spec.get("containers") or []:
        for variable in (container or {}).get("env") or []:
            if isinstance(variable, Mapping) and variable.get("name") == name:
                value = variable.get("value")
                if isinstance(value, str) and value:
                    return value
    return ""


class PodJobs:
    """Resolves callers to their jobs, caching by pod uid."""

    def __init__(self, fetch_pod: PodFetcher, *, ttl: float = 30.0, max_entries: int = 4096) -> None:
        self._fetch_pod = fetch_pod
        self._ttl, self._max = ttl, max_entries
        self._known: OrderedDict[str, tuple[float, PodJob]] = OrderedDict()
        self._lock = threading.Lock()

    def job_of(self, caller: PodCaller) -> PodJob:
        """The job `caller` writes for; Unauthenticated when its pod is gone or another pod now."""
        with self._lock:
            known = self._known.get(caller.pod_uid)
            if known is not None and time.monotonic() - known[0] < self._ttl:
                return known[1]
        pod = self._fetch_pod(caller.namespace, caller.pod_name)
        if pod is None:
            raise Unauthenticated(f"pod {caller.namespace}/{caller.pod_name} does not exist")
        metadata = pod.get("metadata") or {}
        if metadata.get("uid") != caller.pod_uid:
            raise Unauthenticated(f"pod {caller.namespace}/{caller.pod_name} is not the pod the token was issued to")
        try:
            identity = identify(metadata)
        except MalformedPodError as err:
            raise Unauthenticated(f"pod {caller.namespace}/{caller.pod_name}: {err}") from None
        spec = pod.get("spec") or {}
        job_uid = spec_literal(spec, "STITCHFLEET_JOB_UID") or identity.job_uid or caller.pod_uid
        job_name = spec_literal(spec, "STITCHFLEET_JOB_NAME") or identity.job_name
        job = PodJob(caller.namespace, caller.pod_name, job_name, job_uid)
        with self._lock:
            self._known[caller.pod_uid] = (time.monotonic(), job)
            self._known.move_to_end(caller.pod_uid)
            while len(self._known) > self._max:
                self._known.popitem(last=False)
        return job
