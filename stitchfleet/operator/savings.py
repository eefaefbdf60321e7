"""The weekly SavingsReport custom resources: one per ISO week, created or patched by name.

Input: a week label (2026-W47), the fleet figures of that week (`FleetSummary`, filled from
telemetry's weekly summary) and a kubernetes ApiClient. Output: the SavingsReport
`savings-2026-w47` in the operator namespace, spec {week}, status {the figures}. The name is
derived from the week, so a restarted operator patches the report it made before: never two
reports for a week.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stitchfleet.telemetry.savings import WeeklyReport, weekly_summary

GROUP = "stitchfleet.io"
VERSION = "v1alpha1"
PLURAL = "savingsreports"
KIND = "SavingsReport"
WEEK_PATTERN = re.compile(r"^[0-9]{4}-W[0-9]{2}$")
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


@dataclass(frozen=True)
class FleetSummary:
    """The fleet figures of one week, as the CRD's status declares them."""

    tasks: int = 0
    jobs: int = 0
    gpu_hours_saved: float = 0.0
    gross_gpu_hours_saved: float = 0.0
    # CPU jobs save CPU core-hours: a separate unit, never added to the GPU-hours.
    cpu_core_hours_saved: float = 0.0
    gross_cpu_core_hours_saved: float = 0.0
    reverted_jobs: int = 0
    revert_reasons: Mapping[str, int] = field(default_factory=dict)


def week_label(instant: dt.datetime) -> str:
    """The ISO week of an aware instant, in UTC: 2026-W47."""
    year, week, _ = instant.astimezone(dt.UTC).isocalendar()
    return f"{year}-W{week:02d}"


def report_name(week: str) -> str:
    """The object name of a week's report: savings-2026-w47 (a DNS label)."""
    if not WEEK_PATTERN.match(week):
        raise ValueError(f"week {week!r}: expected an ISO week YYYY-Www, e.g. 2026-W47")
    return f"savings-{week.lower()}"


def report_status(summary: FleetSummary, generated_at: dt.datetime) -> dict[str, Any]:
    """The CR status of a summary (camelCase, as the CRD declares it)."""
    return {
        "tasks": summary.tasks,
        "jobs": summary.jobs,
        "gpuHoursSaved": round(summary.gpu_hours_saved, 6),
        "grossGpuHoursSaved": round(summary.gross_gpu_hours_saved, 6),
        "cpuCoreHoursSaved": round(summary.cpu_core_hours_saved, 6),
        "grossCpuCoreHoursSaved": round(summary.gross_cpu_core_hours_saved, 6),
        "revertedJobs": summary.reverted_jobs,
        "revertReasons": {reason or "unspecified": count for reason, count in summary.revert_reasons.items()},
        "generatedAt": generated_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def report_body(week: str, namespace: str) -> dict[str, Any]:
    """A new, status-less SavingsReport for `week`."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": report_name(week),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "stitchfleet-operator", "stitchfleet.io/week": week},
        },
        "spec": {"week": week},
    }


def apply_report(
    api_client: Any, namespace: str, week: str, status: Mapping[str, Any], *, timeout: float = 10.0
) -> dict[str, Any]:
    """Creates the week's report if missing, then patches its status; returns the stored object.

    Each API call gives up after `timeout` seconds: a stuck call would otherwise hold the rollup
    loop, and the operator's shutdown, for as long as the connection lives.
    """
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    name = report_name(week)
    try:
        api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, _request_timeout=timeout)
    except client.ApiException as err:
        if err.status != HTTP_NOT_FOUND:
            raise
        _create(api, client.ApiException, week, namespace, timeout)
    body = {"status": status}
    patched = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, body, _request_timeout=timeout
    )
    return dict(patched)


def _create(api: Any, api_exception: type[Exception], week: str, namespace: str, timeout: float) -> None:
    try:
        body = report_body(week, namespace)
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, _request_timeout=timeout)
    except api_exception as err:
        # Someone (an earlier life of this operator) created it in between: patching is enough.
        if getattr(err, "status", None) != HTTP_CONFLICT:
            raise


def summary_of(report: WeeklyReport) -> FleetSummary:
    """The CR's figures from telemetry's weekly report: a job run is a task, a reverted run a reverted job."""
    totals = report.totals
    gpu, cpu = totals.kind("gpu"), totals.kind("cpu")
    return FleetSummary(
        tasks=totals.tasks,
        jobs=totals.jobs,
        gpu_hours_saved=gpu.net_hours,
        gross_gpu_hours_saved=gpu.gross_hours,
        cpu_core_hours_saved=cpu.net_hours,
        gross_cpu_core_hours_saved=cpu.gross_hours,
        reverted_jobs=totals.reverted_tasks,
        revert_reasons={reason.reason: reason.reverts for reason in totals.revert_reasons},
    )


def ledger_summarizer(engine: Any) -> Callable[[str], FleetSummary]:
    """week label -> FleetSummary, read from the telemetry database (a SQLAlchemy Engine or a URL).

    Typed Any: the operator never imports SQLAlchemy; telemetry.database.connect makes the Engine.
    """

    def summarize(week: str) -> FleetSummary:
        return summary_of(weekly_summary(engine, week))

    return summarize
