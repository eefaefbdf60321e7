"""metrics: a dedicated registry per recorder, scraped over HTTP on loopback."""

from __future__ import annotations

import urllib.request

from stitchfleet.telemetry.metrics import Metrics
from tests.telemetry.workload import workload


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def _value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not in the exposition")


def test_metrics_are_served_and_separate_per_instance() -> None:
    first, second = Metrics(), Metrics()
    for row in workload(windows=20, ranks=1):
        first.observe(row)
    port = first.serve(0, "127.0.0.1")
    try:
        text = _scrape(port)
    finally:
        first.stop()
    assert _value(text, 'stitchfleet_iterations_total{mode="stitched"}') == 1800
    assert _value(text, 'stitchfleet_iterations_total{mode="baseline"}') == 200
    saved = sum(1.0 - 0.01 * i for i in range(20) if i % 10)
    assert abs(_value(text, "stitchfleet_saved_seconds_total") - saved) < 1e-9
    assert _value(text, 'stitchfleet_reverts_total{reason="numeric_mismatch"}') == 1
    assert _value(text, "stitchfleet_enabled_clusters") == 1  # fp-gelu on, fp-ln-bwd reverted
    assert _value(text, 'stitchfleet_step_seconds_count{mode="stitched"}') == 18
    assert 'stitchfleet_step_seconds_bucket{le="0.1",mode="stitched"}' in text
    assert b"stitchfleet_iterations_total{" not in second.exposition()
