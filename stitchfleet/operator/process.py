"""The `stitchfleet operator` process: kopf operator, admission webhook, health and metrics in one.

Input: Settings (STITCHFLEET_*, from the chart's ConfigMap) and the cluster's API (service
account in-cluster, else ~/.kube/config). Output, while it runs: the telemetry schema migrated to
head; with STITCHFLEET_WEBHOOK_SELF_SIGNED, TLS material in the TLS dir and its CA in the
webhook configuration's caBundle; the webhook and the pods' ingestion endpoint (ingest.py) on
STITCHFLEET_WEBHOOK_PORT; kopf's liveness
endpoint on STITCHFLEET_HEALTH_PORT (/healthz); the fleet gauges and per-job figures on STITCHFLEET_METRICS_PORT;
job rows in the database; SavingsReports in the operator namespace. SIGTERM (kopf's own signal
handling) stops the operator; then the webhook, the recorder (flushing or spooling its rows)
and the metrics server stop, in that order. A rollup stuck on the API or the database is
abandoned, not waited for (rollup.py), so the exit stays within the kubelet's grace period; while one
still runs, the process ends without the interpreter's finalization (`leave`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import kopf

from stitchfleet.operator import (
    ca_publisher,
    handlers,
    owners,
    pod_jobs,
    quarantine_requests,
    savings,
    tls,
    tls_secret,
    token_review,
)
from stitchfleet.operator.ingest import IngestService
from stitchfleet.operator.rollup import Rollup, Summarizer
from stitchfleet.operator.webhook_server import WebhookServer
from stitchfleet.settings import Settings
from stitchfleet.telemetry import database
from stitchfleet.telemetry.batch_writer import BatchWriter
from stitchfleet.telemetry.fleet_metrics import FleetMetrics
from stitchfleet.telemetry.job_metrics import JobMetrics
from stitchfleet.telemetry.recorder import Recorder

log = logging.getLogger("stitchfleet.operator")
# A line per handled pod event (kopf) and per probe (aiohttp) would flood the log of a
# cluster-wide watcher; their warnings and errors still pass.
CHATTY_LOGGERS = ("kopf.objects", "aiohttp.access")


def kube_api_client() -> Any:
    """A kubernetes ApiClient: the service account in a pod, else the local kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def liveness_endpoint(current: Settings) -> str:
    """kopf's liveness URL: /healthz on the health port, all interfaces (the kubelet probes it)."""
    return f"http://0.0.0.0:{current.health_port}/healthz"


def prepare_tls(current: Settings, api_client: Any) -> None:
    """Self-signed mode: the Service's material from its Secret (made once, tls_secret.py), its CA into our
    webhook configuration."""
    if not current.webhook_self_signed:
        return
    material = tls_secret.ensure(
        api_client,
        current.operator_namespace,
        current.webhook_service,
        current.webhook_tls_dir,
        timeout=current.api_timeout_seconds,
    )
    tls.patch_ca_bundle(current.webhook_config_name, material.ca_pem, api_client, timeout=current.api_timeout_seconds)
    log.info("self-signed webhook certificate written to %s", current.webhook_tls_dir)


def make_ca_publisher(current: Settings, api_client: Any) -> ca_publisher.CaPublisher | None:
    """The publisher of the webhook's CA into opted-in pods' namespaces (none without a ConfigMap name)."""
    if not current.ingest_ca_configmap:
        return None
    write = ca_publisher.api_configmap_writer(api_client, current.api_timeout_seconds)
    return ca_publisher.CaPublisher(write, current.ingest_ca_configmap, current.webhook_tls_dir / tls.CA_FILE)


def make_rollup(current: Settings, api_client: Any, metrics: FleetMetrics, summarize: Summarizer) -> Rollup:
    """The rollup publishing SavingsReports into the operator namespace."""

    def publish(week: str, status: Any) -> object:
        namespace, timeout = current.operator_namespace, current.api_timeout_seconds
        return savings.apply_report(api_client, namespace, week, status, timeout=timeout)

    return Rollup(summarize=summarize, publish=publish, metrics=metrics)


def make_ingest(current: Settings, api_client: Any, metrics: FleetMetrics, writer: BatchWriter) -> IngestService:
    """The ingestion endpoint: TokenReviews and pod reads through the API, rows into `writer`."""
    timeout = current.api_timeout_seconds
    reviewer = token_review.TokenReviewer(token_review.api_review(api_client, timeout), current.ingest_audience)
    jobs = pod_jobs.PodJobs(pod_jobs.api_pod_fetcher(api_client, timeout))
    return IngestService(
        current.cluster,
        reviewer,
        jobs,
        writer,
        JobMetrics(metrics.registry),
        slower_jobs=current.slower_jobs,
        slower_ttl=current.slower_ttl,
    )


@contextlib.contextmanager
def running_services(current: Settings, api_client: Any, summarize: Summarizer) -> Iterator[handlers.OperatorContext]:
    """Schema, TLS, webhook, metrics and recorder up; the handlers' context; all stopped on exit."""
    database.upgrade(current.database_url)
    prepare_tls(current, api_client)
    metrics = FleetMetrics()
    recorder = Recorder(current.database_url, settings=current, metrics_port=0)
    writer = BatchWriter(current.database_url)
    publisher = make_ca_publisher(current, api_client)
    write_status = quarantine_requests.api_status_writer(api_client, current.api_timeout_seconds)
    quarantine = quarantine_requests.QuarantineRequests(
        current.database_url, current.cluster, current.operator_namespace, write_status
    )
    ingest = make_ingest(current, api_client, metrics, writer)
    on_injected = None if publisher is None else publisher.want
    webhook = WebhookServer.from_settings(current, ingest=ingest, on_injected=on_injected)
    try:
        if current.metrics_port:
            metrics.serve(current.metrics_port)
        if publisher is not None:
            publisher.start()
        webhook.start()
        rollup = make_rollup(current, api_client, metrics, summarize)
        yield handlers.OperatorContext(
            current.cluster,
            recorder,
            metrics,
            rollup=rollup,
            rollup_seconds=current.rollup_seconds,
            owners=owners.OwnerChains(owners.api_job_fetcher(api_client, timeout=current.api_timeout_seconds)),
            ca_publisher=publisher,
            quarantine=quarantine,
        )
    finally:
        webhook.stop()
        if publisher is not None:
            publisher.stop()
        writer.close()
        recorder.close()
        metrics.stop()
        quarantine.close()


async def operate(
    context: handlers.OperatorContext,
    registry: kopf.OperatorRegistry,
    *,
    liveness: str | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Runs kopf with our handlers, cluster-wide and standalone, until stopped or signalled."""
    await kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=True,
        liveness_endpoint=liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def configure_logging(current: Settings) -> None:
    """One line format for the process; per-event chatter only at DEBUG."""
    logging.basicConfig(level=current.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if current.log_level != "DEBUG":
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def run(current: Settings, summarize: Summarizer) -> int:
    """The whole process; returns its exit status once kopf has stopped."""
    configure_logging(current)
    api_client = kube_api_client()
    with running_services(current, api_client, summarize) as context:
        registry = handlers.build_registry(context)
        asyncio.run(operate(context, registry, liveness=liveness_endpoint(current)))
    return 0


def leave(status: int) -> int:
    """`status`, for the caller to exit with; or, while a daemon thread still runs (a rollup abandoned on SIGTERM,
    rollup.in_daemon_thread), the process ends here: logs and output flushed, then `os._exit(status)`.

    Why not the interpreter's own exit: a daemon thread that wakes during finalization (its API call answered) is
    ended by CPython with pthread_exit, whose unwinding aborts the whole process (SIGABRT) when the thread's stack
    crosses frames that cannot unwind. A rollup's API call does: pydantic_core's, under the kubernetes client's
    validate_call. Seen in CI as the operator's exit status -6 after a clean stop (benchmarks/README.md, "Session
    46"). Everything the process owns is closed by then; the abandoned rollup loses nothing (the next recomputes).
    """
    running = [t.name for t in threading.enumerate() if t.daemon and t.is_alive()]
    if not running:
        return status
    log.info("exiting with %d thread(s) still running, without finalization: %s", len(running), ", ".join(running))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
