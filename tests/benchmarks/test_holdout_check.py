"""scripts/holdout_check.py's clock without running a job: the stitched runs' saving against the plain processes'
mean wall, its prediction interval, and the summary lines (holdouts against plain)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import holdout_check

from stitchfleet.telemetry.paired import t_quantile


def test_the_clock_sums_each_stitched_run_against_the_plain_mean_with_a_prediction_interval() -> None:
    plain, stitched = [10.0, 12.0, 11.0], [9.0, 8.5]
    clock = holdout_check.clock_saving(plain, stitched)
    assert clock.plain_mean == pytest.approx(11.0)
    assert clock.saved == pytest.approx((11.0 - 9.0) + (11.0 - 8.5))
    # sd 1.0 over three plain walls, two stitched runs: the mean's error (2 runs x sd / sqrt 3) and each run's own
    assert clock.plain_sd == pytest.approx(1.0)
    assert clock.half_width == pytest.approx(t_quantile(2) * math.sqrt(4 / 3 + 2))


def test_one_plain_process_gives_no_interval() -> None:
    clock = holdout_check.clock_saving([10.0], [9.0])
    assert clock.saved == pytest.approx(1.0) and clock.half_width is None


def test_the_summary_sets_holdouts_against_plain_and_says_the_stitched_runs_saving() -> None:
    runs = [
        holdout_check.Run("plain", 10.0, 100),
        holdout_check.Run("plain", 12.0, 100),
        holdout_check.Run("holdout", 11.5, 100),
        holdout_check.Run("holdout", 10.5, 100),
        holdout_check.Run("stitched", 8.0, 100),
    ]
    lines = holdout_check.summary(runs)
    assert lines[0] == "plain: 2 runs, wall 11.00 s (sd 1.41 s)"
    assert lines[2] == "stitched: 1 runs, wall 8.00 s"
    half = t_quantile(1) * math.sqrt(2.0) * math.sqrt(1 / 2 + 1)
    assert lines[3] == f"the clock: the stitched runs saved +3.00 s +- {half:.2f} s against the plain processes"
    assert (
        lines[4] == "holdout walls minus plain walls: +0.00 s (standard error 1.12 s)"
    )  # hypot(1.41 / sqrt 2, 0.71 / sqrt 2)
