"""scripts/claim_pairs.py's figures without running a job: the report's gross over a warm run's stitched windows
against the clock on the same step numbers, the settled baseline steps, and the summary over pairs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import claim_pairs

from stitchfleet.plugin.control.step_windows import SETTLE_STEPS


def _runs(reference: float, baseline: float) -> tuple[list[float], list[float], list[claim_pairs.Window]]:
    """A plain process at 1.0 ms a step; a warm one whose 10-step block (steps 0-9) runs at `baseline` after
    SETTLE_STEPS slower ones, and whose stitched window (steps 10-29) runs at 0.7 ms against `reference`."""
    plain = [0.001] * 30
    warm = [0.002] * SETTLE_STEPS + [baseline] * (10 - SETTLE_STEPS) + [0.0007] * 20
    windows: list[claim_pairs.Window] = [
        ("baseline", 0, 9, 10, sum(warm[:10]), None),
        ("stitched", 10, 29, 20, 0.014, reference),
    ]
    return plain, warm, windows


def test_a_reference_above_plain_tfs_step_books_more_than_the_clock_saw() -> None:
    """The MLP between processes (session 51, 28 pairs): the settled baseline steps stood +8.4% over plain processes'
    median step, and the report's gross +0.35 s over the clock on the same steps."""
    plain, warm, windows = _runs(reference=0.00108, baseline=0.00108)
    found = claim_pairs.compare(plain, warm, windows)
    assert found is not None and found.steps == 20
    assert found.report == pytest.approx(20 * (0.00108 - 0.0007))
    assert found.clock == pytest.approx(20 * (0.001 - 0.0007))
    assert found.gap == pytest.approx(20 * 0.00008)
    assert found.settled == pytest.approx(1.08)  # the block's first SETTLE_STEPS steps are left out


def test_a_reference_at_plain_tfs_step_books_what_the_clock_saw() -> None:
    plain, warm, windows = _runs(reference=0.001, baseline=0.001)
    found = claim_pairs.compare(plain, warm, windows)
    assert found is not None and found.gap == pytest.approx(0.0) and found.settled == pytest.approx(1.0)


def test_a_run_without_stitched_windows_or_of_another_length_is_no_pair() -> None:
    plain, warm, windows = _runs(reference=0.001, baseline=0.001)
    assert claim_pairs.compare(plain, warm, windows[:1]) is None  # its setup skipped: nothing stitched
    assert claim_pairs.compare(plain, warm, [(*windows[1][:5], None)]) is None  # no reference to pair with
    assert claim_pairs.compare(plain[:-1], warm, windows) is None


def test_the_summary_gives_the_gaps_mean_with_its_standard_error() -> None:
    pairs = [claim_pairs.Pair(report=2.0 + d, clock=2.0, settled=1.0 + d / 10, steps=100) for d in (0.1, 0.3, 0.5)]
    lines = claim_pairs.summary(pairs)
    error = 0.2 / math.sqrt(3)  # the gaps' standard deviation over sqrt(3)
    assert lines[0].startswith("3 pairs: the report's gross 2.300 s a run on average")
    assert f"+0.300 s (standard error {error:.3f} s; median +0.300 s), +13.0% of the report's gross" in lines[0]
    assert lines[1].startswith("the warm runs' settled baseline steps against the plain processes' median step: +3.")
    assert claim_pairs.summary(pairs[:1]) == ["1 pair(s) with stitched windows: too few for a mean and its error"]
