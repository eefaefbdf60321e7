"""A task's claimed saving from its paired windows (`telemetry.paired`): a spike in one baseline block is no
saving, a real one is claimed, speedup and gross agree in sign, through `step_windows` as the plugin books them."""

from __future__ import annotations

import numpy as np
import pytest

from stitchfleet.plugin.control.schedule import BASELINE, STITCHED
from stitchfleet.plugin.control.step_windows import Window, Windows
from stitchfleet.telemetry import paired, savings

PERIOD, BLOCK = 100, 5  # the default cadence: a 5-step baseline block every 100 steps (5%)


def _job(stitched: float, spike_block: int | None = None, blocks: int = 12, seed: int = 0) -> list[Window]:
    """Steps of 10 ms plain TF (1% jitter), `stitched` on the twin, a baseline block every PERIOD steps; the block
    `spike_block` ran under load (every step +50%), as the CIFAR-10 job's one baseline window did (issue 29)."""
    rng = np.random.default_rng(seed)
    windows, closed = Windows(size=100), []
    for step in range(blocks * PERIOD):
        block, offset = divmod(step, PERIOD)
        mode = BASELINE if offset < BLOCK else STITCHED
        seconds = (0.010 if mode == BASELINE else stitched) * (1 + 0.01 * rng.standard_normal())
        if mode == BASELINE and block == spike_block:
            seconds *= 1.5
        closed += windows.add(step, mode, float(seconds), True)
    return closed + windows.close()


def _claim(windows: list[Window]) -> paired.Claim:
    rows = [(w.row_mode, w.iterations, sum(w.seconds), w.baseline, w.saved_seconds) for w in windows]
    return paired.claim(paired.PairedSums.windows(rows), sum(w.saved_seconds for w in windows))


def test_a_load_spike_in_one_baseline_block_is_no_claimed_saving() -> None:
    """Stitching changes nothing; one block ran 50% slower. Its two neighbouring windows measure ~0.25 s each,
    which the interval's spread holds: nothing is claimed (before: each window beyond its own noise claimed). Over
    100 seeds: never claimed; without the spike the interval holds the truth 94 times (95% nominal)."""
    found = _claim(_job(0.010, spike_block=5))
    assert found.measured > 0.3  # the spike's neighbours, measured
    assert found.low < 0.0 < found.high and found.claimed == 0.0


def test_a_real_saving_is_claimed_with_an_interval_around_it() -> None:
    found = _claim(_job(0.009))  # 1 ms a step on ~1140 stitched steps
    assert found.claimed == found.measured and 0.0 < found.low < found.measured < found.high
    assert found.measured == pytest.approx(1.14, rel=0.05)


def test_a_real_saving_survives_a_spike_it_outweighs() -> None:
    found = _claim(_job(0.008, spike_block=5, blocks=30))
    assert found.claimed > 0.0 and found.low > 0.0


def test_a_real_loss_is_claimed_as_a_loss() -> None:
    found = _claim(_job(0.011))
    assert found.claimed < 0.0 and found.high < 0.0


def test_fewer_than_three_paired_windows_claim_nothing() -> None:
    sums = paired.PairedSums.windows([(STITCHED, 100, 0.9, 0.01, 0.1), (STITCHED, 100, 0.9, 0.01, 0.1)])
    assert paired.claim(sums, 0.2) == paired.Claim(0.2, -np.inf, np.inf, 0.0)


@pytest.mark.parametrize("stitched", [0.009, 0.010, 0.011])
def test_speedup_and_gross_agree_in_sign(stitched: float) -> None:
    windows = _job(stitched, seed=3)
    rows = [(w.row_mode, w.iterations, sum(w.seconds), w.baseline, w.saved_seconds) for w in windows]
    measured = sum(w.saved_seconds for w in windows)
    sums = paired.PairedSums.windows(rows)
    found = paired.claim(sums, measured)
    ratio = savings.speedup(*paired.paired_means(sums, measured), found.claimed)
    if found.claimed == 0.0:
        assert ratio is None
    else:
        assert ratio is not None and (ratio > 1.0) == (found.claimed > 0.0)


def test_t_quantiles() -> None:
    assert paired.t_quantile(1) == 12.706 and paired.t_quantile(30) == 2.042
    assert paired.t_quantile(31) == pytest.approx(2.040, abs=0.002) and paired.t_quantile(1000) == pytest.approx(
        1.962, abs=0.002
    )
