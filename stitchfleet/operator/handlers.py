"""The kopf handlers of the operator, registered on a fresh registry per operator run.

Input: an `OperatorContext` (cluster name, a telemetry sink, the fleet gauges, the rollup, the
owner chains, StitchQuarantine requests). Output: a `kopf.OperatorRegistry` with: an index of opted-in
pods by job; event handlers for those pods (their namespaces told to the CA publisher), for
StitchQuarantine objects (quarantine_requests.py) and for their owners (batch Jobs, TFJobs, MPIJobs) that record
`JobStarted` / `JobFinished` rows, skipping an MPIJob's launcher Job and its pods (owners.py);
and start-up/clean-up handlers that set kopf up (standalone, no posting noise) and run the
periodic rollup.

Only `@kopf.on.event` and an index: kopf then stores nothing on the watched objects (no
annotations, no finalizers), which the read-only RBAC on pods and jobs requires. Every handler
derives its rows from the object it gets, so a restart, which re-lists everything, rewrites the
same rows and the store's idempotent upserts keep the figures as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf

from stitchfleet.operator import quarantine_requests, tracking
from stitchfleet.operator.ca_publisher import CaPublisher
from stitchfleet.operator.identity import LABEL_ENABLED
from stitchfleet.operator.owners import OwnerChains
from stitchfleet.operator.rollup import Rollup
from stitchfleet.telemetry.fleet_metrics import FleetMetrics
from stitchfleet.telemetry.rows import Row

log = logging.getLogger("stitchfleet.operator")
OPTED_IN = {LABEL_ENABLED: "true"}
# Owners whose pods we track; kopf skips (with a warning) a kind whose CRD the cluster lacks.
# Versions are explicit: kopf serves a version-less selector only in the group's preferred
# version, and a cluster with Kubeflow's training operator (kubeflow.org/v1) and the MPI
# operator v2 (MPIJob in kubeflow.org/v2beta1) prefers v1, where there are no MPIJobs.
OWNER_RESOURCES = (
    ("batch", "v1", "jobs"),
    ("kubeflow.org", "v1", "tfjobs"),
    ("kubeflow.org", "v1", "mpijobs"),  # the training operator's MPIJob (launcher is a pod)
    ("kubeflow.org", "v2beta1", "mpijobs"),  # the MPI operator v2 (launcher is a batch Job)
)


class RowSink(Protocol):
    """Where rows go: telemetry's Recorder (batched, spooled while the database is down)."""

    def record(self, row: Row) -> None: ...


@dataclass
class OperatorContext:
    """What the handlers need; one per operator run."""

    cluster: str
    sink: RowSink
    metrics: FleetMetrics
    rollup: Rollup | None = None
    rollup_seconds: float = 300.0
    owners: OwnerChains = field(default_factory=OwnerChains)
    # Told each opted-in pod's namespace: it keeps the ingestion CA's ConfigMap there (a restart re-lists them).
    ca_publisher: CaPublisher | None = None
    # StitchQuarantine objects (GitOps' confirm/clear), and how often a request the database refused is retried.
    quarantine: quarantine_requests.QuarantineRequests | None = None
    quarantine_retry_seconds: float = 30.0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def record(self, rows: list[Row]) -> None:
        """Hands rows to the sink."""
        for row in rows:
            self.sink.record(row)


def _owner_opted_in(body: Mapping[str, Any], **_: Any) -> bool:
    return tracking.owner_opted_in(body)


def build_registry(context: OperatorContext, registry: kopf.OperatorRegistry | None = None) -> kopf.OperatorRegistry:
    """Every handler of the operator, bound to `context`, added to `registry`.

    The default registry logs in through the kubernetes client (in-cluster service account, else
    kubeconfig), as the rest of the process does; tests pass a bare one with their own login.
    """
    if registry is None:
        registry = kopf.OperatorRegistry()
        kopf.on.login(registry=registry)(kopf.login_via_client)
    _register_lifecycle(registry, context)
    _register_pods(registry, context)
    if context.quarantine is not None:
        _register_quarantine(registry, context.quarantine)
    for group, version, plural in OWNER_RESOURCES:
        _register_owner(registry, context, group, version, plural)
    return registry


def _register_lifecycle(registry: kopf.OperatorRegistry, context: OperatorContext) -> None:
    async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
        # One replica (strategy Recreate): no peering objects, hence no CRDs of kopf's own.
        settings.peering.standalone = True
        # Failures are logged; k8s Events only for real problems (RBAC allows create/patch).
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        if context.rollup is not None:
            context.tasks.append(asyncio.create_task(context.rollup.run_forever(context.rollup_seconds)))
        if context.quarantine is not None:
            retrying = _retry_forever(context.quarantine, context.quarantine_retry_seconds)
            context.tasks.append(asyncio.create_task(retrying))

    async def stop(**_: Any) -> None:
        for task in context.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        context.tasks.clear()

    # Called, not used as decorators: kopf is untyped for mypy, and decorators would erase the types.
    kopf.on.startup(registry=registry)(start)
    kopf.on.cleanup(registry=registry)(stop)


def _register_pods(registry: kopf.OperatorRegistry, context: OperatorContext) -> None:
    def pods_by_job(body: kopf.Body, uid: str | None, **_: Any) -> dict[Any, Any] | None:
        key = None if context.owners.ignores(body) else tracking.pod_job_key(body, context.cluster)
        return None if key is None else {key: uid}

    def pod_event(event: Mapping[str, Any], body: kopf.Body, pods_by_job: kopf.Index[Any, Any], **_: Any) -> None:
        if context.owners.ignores(body):
            return  # an MPIJob's launcher: not a rank, and the MPIJob's conditions give the outcome
        if context.ca_publisher is not None and event.get("type") != "DELETED":
            context.ca_publisher.want(str(body.get("metadata", {}).get("namespace") or ""))
        key = tracking.pod_job_key(body, context.cluster)
        known = len(pods_by_job.get(key, [])) if key is not None else 0
        rows = tracking.pod_rows(body, context.cluster, known, deleted=event.get("type") == "DELETED")
        context.record(rows)
        context.metrics.jobs_tracked.set(len(pods_by_job))

    kopf.index("pods", id="pods_by_job", labels=OPTED_IN, registry=registry)(pods_by_job)
    kopf.on.event("pods", labels=OPTED_IN, registry=registry)(pod_event)


def _register_quarantine(registry: kopf.OperatorRegistry, requests: quarantine_requests.QuarantineRequests) -> None:
    async def quarantine_event(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
        metadata = body.get("metadata", {})
        if event.get("type") == "DELETED":
            requests.forget(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
            return
        # The database write and the status patch block: off kopf's loop.
        await asyncio.to_thread(requests.handle, dict(body))

    resource = (quarantine_requests.GROUP, quarantine_requests.VERSION, quarantine_requests.PLURAL)
    kopf.on.event(*resource, id=quarantine_requests.PLURAL, registry=registry)(quarantine_event)


async def _retry_forever(requests: quarantine_requests.QuarantineRequests, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await asyncio.to_thread(requests.retry)
        except Exception:
            log.exception("retrying StitchQuarantine requests failed")


def _register_owner(
    registry: kopf.OperatorRegistry, context: OperatorContext, group: str, version: str, plural: str
) -> None:
    def owner_event(body: kopf.Body, **_: Any) -> None:
        if plural == "jobs" and context.owners.learn(body) is not None:
            return  # an MPIJob's launcher: the MPIJob's own conditions say how the job ended
        context.record(tracking.owner_rows(body, context.cluster))

    def learn_job(body: kopf.Body, **_: Any) -> None:
        context.owners.learn(body)  # indexes nothing itself: the owner chains keep the answer

    def job_deleted(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
        if event.get("type") == "DELETED":
            context.owners.forget(body)

    # One id per version: kopf otherwise names both MPIJob handlers alike.
    kopf.on.event(group, version, plural, id=f"{plural}.{version}", when=_owner_opted_in, registry=registry)(
        owner_event
    )
    if plural == "jobs":
        # Indexes are filled before any handler runs: a restarted operator learns its launcher
        # Jobs from the listing instead of fetching each one for its pods.
        kopf.index(group, version, plural, id="launcher_jobs", when=_owner_opted_in, registry=registry)(learn_job)
        # Every Job, opted in or not: the launcher cache may hold any Job an opted-in pod named.
        kopf.on.event(group, version, plural, id="jobs.deleted", registry=registry)(job_deleted)
