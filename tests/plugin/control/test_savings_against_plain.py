"""The report's claimed saving against the same job run plain, measured in the same process (TF CPU).

One job (the small BERT encoder, the same script and steps) runs twice in one process, plain and under the
plugin, in two sessions whose steps alternate chunk by chunk (a load spike hits both). Measured: plain TF's
step seconds minus the plugin's, summed over the job's steps (session creation, where `begin`'s compile runs,
is left out: TF's own creation of a larger graph is not the steps' business). Claimed: the weekly report's
gross saving of the job's windows minus the setup it booked from steps (the warmup's executor builds, the
kernels' first runs), per device, back to the rank's seconds. They must agree within the stated noise: the
chunks' paired differences and the windows' own standard errors (`Window.noise`). No speed is asserted:
which way the plugin goes is this machine's business.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.telemetry.savings import weekly_summary
from stitchfleet.telemetry.weeks import week_of
from tests.plugin.hook_harness import _feeds, make_settings

pytestmark = pytest.mark.tf

SETTINGS = {
    "STITCHFLEET_BASELINE_STEPS": "6",
    "STITCHFLEET_PAIRED_STEPS": "3",
    "STITCHFLEET_REBASELINE_EVERY": "30",
    "STITCHFLEET_WINDOW_STEPS": "30",
    "STITCHFLEET_CHECK_EVERY": "100",
    "STITCHFLEET_PROBE_STEPS": "4",
    "STITCHFLEET_PROBE_ROUNDS": "1",
}


@dataclass
class Job:
    """One of the two sessions: its wall seconds per chunk (the first with the session's creation)."""

    hook: StitchHook | None
    graph: Any = None
    session: Any = None
    chunks: list[float] = field(default_factory=list)  # each chunk's step seconds, summed

    def run(self, steps: int) -> None:
        if self.session is None:
            self.graph = models.build("bert_encoder", "small", seed=1)
            with self.graph.as_default():
                self.fetches = [self.graph.get_tensor_by_name("loss:0"), self.graph.get_operation_by_name("train_op")]
                self.feeds = _feeds(self.graph)
                self.session = tf.compat.v1.train.MonitoredSession(hooks=[self.hook] if self.hook else [])
        spent = 0.0
        for _ in range(steps):
            started = time.perf_counter()
            self.session.run(self.fetches, self.feeds)
            spent += time.perf_counter() - started
        self.chunks.append(spent)


def _alternated(tmp: Path, steps: int, chunk: int) -> tuple[float, float, float, float]:
    """(measured seconds saved, its noise, the report's claimed net seconds saved, the claim's noise)."""
    url = f"sqlite:///{tmp / 'telemetry.db'}"
    hook = StitchHook(make_settings(tmp, "against-plain", **SETTINGS), backend="cpu", db_url=url)
    plugin, plain = Job(hook), Job(None)
    for first in range(0, steps, chunk):
        for job in (plugin, plain) if (first // chunk) % 2 == 0 else (plain, plugin):
            job.run(min(chunk, steps - first))
    for job in (plugin, plain):
        job.session.close()
    pairs = [a - b for a, b in zip(plain.chunks, plugin.chunks, strict=True)]
    measured = sum(pairs)
    noise = statistics.stdev(pairs[1:]) * len(pairs) ** 0.5  # the first pair holds the builds: not its spread
    [found] = weekly_summary(url, week_of(dt.datetime.now(dt.UTC))).jobs
    controller = hook.controller
    assert controller is not None and found.iterations == steps
    per_device = 3600.0 / found.devices_per_rank  # device-hours back to the rank's seconds
    assert found.compile_hours * per_device == pytest.approx(controller.setup_total)  # what the report books
    from_steps = (controller.warmup.seconds or 0.0) + controller.first_seconds
    return measured, noise, found.gross_hours * per_device - from_steps, controller.saved_variance**0.5


def _agrees(tmp: Path, steps: int, chunk: int) -> None:
    measured, noise, claimed, claim_noise = _alternated(tmp, steps, chunk)
    stated = 3.0 * (noise**2 + claim_noise**2) ** 0.5
    detail = f"measured {measured:+.3f} s (noise {noise:.3f}), claimed {claimed:+.3f} s (noise {claim_noise:.3f})"
    print(detail)
    assert abs(claimed - measured) <= stated, detail


def test_the_reports_saving_agrees_with_the_measured_difference_on_a_small_job(tmp_path: Path) -> None:
    _agrees(tmp_path, 600, 50)


@pytest.mark.sweep
def test_the_reports_saving_agrees_with_the_measured_difference_on_a_longer_job(tmp_path: Path) -> None:
    _agrees(tmp_path, 4000, 200)
