"""job_metrics: per-job figures from ingested rows; replays change nothing, old jobs are dropped."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.job_metrics import JobMetrics
from tests.telemetry.workload import job_key, workload

JOB = {"namespace": "vision", "job": "resnet-train"}


def figures(registry: CollectorRegistry) -> dict[str, float | None]:
    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"stitchfleet_job_{name}", {**JOB, **labels})

    return {
        "stitched": value("iterations", mode="stitched"),
        "baseline": value("iterations", mode="baseline"),
        "step": value("step_seconds", mode="stitched"),
        "saved": value("saved_seconds"),
        "reverts": value("reverts"),
    }


def test_figures_per_job_and_a_replay_changes_nothing() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    rows = workload(windows=20, ranks=2)
    metrics.stored(rows)
    windows = [row for row in rows if isinstance(row, r.StepWindow)]
    stitched = [w for w in windows if w.mode == "stitched"]
    iterations = sum(w.iterations for w in stitched)
    first = figures(registry)
    assert first["stitched"] == iterations
    assert first["step"] == pytest.approx(sum(w.step_seconds_sum for w in stitched) / iterations)
    assert first["saved"] == pytest.approx(sum(w.saved_seconds for w in windows))
    assert first["reverts"] == 1
    metrics.stored(rows)  # the same batch again: a pod that never got the answer
    assert figures(registry) == pytest.approx(first)
    assert registry.get_sample_value("stitchfleet_ingest_rows_total") == 2 * len(rows)
    assert registry.get_sample_value("stitchfleet_ingest_batches_total") == 2


def test_a_rewritten_window_replaces_its_earlier_figures() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    window = r.StepWindow(job_key(), 0, 0, 0, 9, 10, "baseline", 1.0, 0.1, 0.0)
    metrics.stored([window])
    metrics.stored([dataclasses.replace(window, mode="stitched", step_seconds_sum=0.5, saved_seconds=0.5)])
    now = figures(registry)
    assert (now["baseline"], now["stitched"], now["saved"]) == (0, 10, 0.5)


def test_the_least_recently_updated_job_is_dropped_past_the_bound() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry, max_jobs=2)
    for uid, name in (("a", "first"), ("b", "second"), ("c", "third")):
        key = r.JobKey("c1", "ns", name, uid)
        metrics.stored([r.StepWindow(key, 0, 0, 0, 0, 1, "stitched", 0.1)])

    def iterations(name: str) -> float | None:
        return registry.get_sample_value(
            "stitchfleet_job_iterations", {"namespace": "ns", "job": name, "mode": "stitched"}
        )

    assert (iterations("first"), iterations("second"), iterations("third")) == (None, 1, 1)
