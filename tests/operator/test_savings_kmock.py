"""SavingsReports and the caBundle patch against kmock, figures from a real SQLite ledger."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes import client

from stitchfleet.operator import savings, tls
from stitchfleet.operator.rollup import Rollup
from stitchfleet.telemetry import database
from stitchfleet.telemetry.fleet_metrics import FleetMetrics
from stitchfleet.telemetry.rows import JobCompiled, JobKey, JobStarted, StepWindow
from tests.telemetry.workload import write

pytestmark = pytest.mark.timeout(60)
REPORTS = "stitchfleet.io/v1alpha1/savingsreports"
WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
NOW = dt.datetime(2026, 11, 18, 12, 0, tzinfo=dt.UTC)


def api_client(api: kmock.KubernetesEmulator) -> Any:
    config = client.Configuration()
    config.host = str(api.url).rstrip("/")
    return client.ApiClient(config)


def seed(url: str) -> None:
    """One 4-GPU job in 2026-W47: 4 stitched windows saving 900 s each, 90 s of compiling. (A report claims a
    saving only with an interval over at least 3 paired windows, `telemetry.paired`: 2 windows claimed nothing.)"""
    database.upgrade(url)
    key = JobKey("gpu-east", "ml", "resnet-train", "uid-1")
    started = NOW - dt.timedelta(hours=3)
    rows: list[Any] = [JobStarted(key, gpus_per_rank=4, started_at=started), JobCompiled(key, 0, 90.0)]
    for index in range(4):
        rows.append(StepWindow(key, 0, index, index * 100, index * 100 + 99, 100, "stitched", 100.0, 1.0, 900.0, NOW))
    write(url, rows)


@pytest.mark.asyncio
async def test_one_report_per_week_with_the_fleet_summary_across_restarts(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    kmock.resources[REPORTS] = kmock.ResourceInfo(kind="SavingsReport", namespaced=True, subresources={"status"})
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    seed(url)
    engine = database.connect(url)
    metrics = FleetMetrics()

    def publish(week: str, status: Any) -> object:
        return savings.apply_report(api_client(kmock), "stitchfleet-system", week, status)

    try:
        for _life in range(2):  # a restarted operator computes and publishes the same reports again
            rollup = Rollup(savings.ledger_summarizer(engine), publish, metrics, clock=lambda: NOW)
            done = await asyncio.to_thread(rollup.run_once)
    finally:
        engine.dispose()
    assert sorted(done) == ["2026-W46", "2026-W47"]
    names = sorted(name for (_resource, _ns, name) in kmock.objects if name.startswith("savings-"))
    assert names == ["savings-2026-w46", "savings-2026-w47"]
    report = kmock.objects[REPORTS, "stitchfleet-system", "savings-2026-w47"]
    assert report["spec"] == {"week": "2026-W47"}
    status = report["status"]
    assert status["tasks"] == 1 and status["jobs"] == 1 and status["revertedJobs"] == 0
    assert status["grossGpuHoursSaved"] == pytest.approx(4.0)
    assert status["gpuHoursSaved"] == pytest.approx(3.9)
    assert status["generatedAt"] == "2026-11-18T12:00:00Z"
    assert kmock.objects[REPORTS, "stitchfleet-system", "savings-2026-w46"]["status"]["tasks"] == 0
    exposition = metrics.exposition().decode()
    assert "stitchfleet_fleet_week_gpu_hours_saved 3.9" in exposition
    assert len(kmock["post"]) == 2, "each week's report is created once; later rollups patch it"


def test_a_malformed_week_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"2026-47.*expected an ISO week"):
        savings.report_name("2026-47")


@pytest.mark.asyncio
async def test_ca_bundle_patch_reaches_our_webhook_configuration(kmock: kmock.KubernetesEmulator) -> None:
    kmock.resources[WEBHOOKS] = kmock.ResourceInfo(kind="MutatingWebhookConfiguration", namespaced=False)
    webhook = {"name": "pods.stitchfleet.io", "clientConfig": {"service": {"name": "sf", "namespace": "sf-system"}}}
    kmock.objects[WEBHOOKS, None, "stitchfleet"] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "stitchfleet", "resourceVersion": "7"},
        "webhooks": [{**webhook, "admissionReviewVersions": ["v1"], "sideEffects": "None"}],
    }
    material = tls.make_self_signed(tls.service_dns_names("sf", "sf-system"))
    await asyncio.to_thread(tls.patch_ca_bundle, "stitchfleet", material.ca_pem, api_client(kmock))
    stored = kmock.objects[WEBHOOKS, None, "stitchfleet"]
    assert base64.b64decode(stored["webhooks"][0]["clientConfig"]["caBundle"]) == material.ca_pem
    patch = kmock["patch"][0]
    assert patch.headers["Content-Type"] == "application/json-patch+json"
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": "7"} in patch.data
