"""The slowdown guard's brackets (`plugin/control/slowdown.py`): a baseline window against the stitched steps right
around it, a drifting machine cancelling out, far-away steps not used, and the noise of a median difference."""

from __future__ import annotations

import pytest

from stitchfleet.plugin.control.schedule import BASELINE, PROBE, STITCHED, median_noise
from stitchfleet.plugin.control.slowdown import Bracket


def feed(bracket: Bracket, steps: list[tuple[int, str, float]]) -> list[tuple[float, float, float]]:
    taken = []
    for step, mode, seconds in steps:
        bracket.add(step, mode, seconds)
        found = bracket.take()
        if found is not None:
            taken.append(found)
    return taken


def test_a_baseline_window_is_compared_with_the_steps_before_and_after_it() -> None:
    steps = [(s, STITCHED, 1.0) for s in range(0, 10)]
    steps += [(s, BASELINE, 2.0) for s in range(10, 14)]
    steps += [(s, STITCHED, 1.2) for s in range(14, 30)]
    (taken,) = feed(Bracket(size=4, gap=4), steps)
    stitched, base, noise = taken
    assert stitched == pytest.approx(1.1) and base == 2.0  # before 4 x 1.0, after 4 x 1.2
    assert noise == pytest.approx(1.2533 * 1.4826 * 0.1 / 8**0.5)  # the brackets' spread, 8 steps


def test_a_steady_drift_cancels_between_the_brackets() -> None:
    """The machine gets 1% slower every step: the baseline window in the middle is compared with steps
    as much earlier as later, so an unchanged step reads as unchanged (the old guard saw +9%)."""
    load = [1.0 + 0.01 * s for s in range(30)]
    steps = [(s, STITCHED if not 10 <= s < 14 else BASELINE, load[s]) for s in range(30)]
    ((stitched, base, _),) = feed(Bracket(size=4, gap=4), steps)
    assert stitched == pytest.approx(base, abs=0.01)


def test_no_comparison_without_stitched_steps_close_after_the_window() -> None:
    steps = [(s, BASELINE, 1.0) for s in range(0, 4)] + [(s, PROBE, 0.5) for s in range(4, 40)]
    steps += [(s, STITCHED, 0.9) for s in range(40, 50)]  # 36 steps later: not adjacent
    assert feed(Bracket(size=4, gap=4), steps) == []


def test_the_first_window_after_probing_uses_the_after_bracket_alone() -> None:
    steps = [(s, PROBE, 0.8) for s in range(0, 6)] + [(s, BASELINE, 1.0) for s in range(6, 12)]
    steps += [(s, STITCHED, 0.9) for s in range(12, 20)]
    ((stitched, base, _),) = feed(Bracket(size=4, gap=4), steps)
    assert (stitched, base) == (0.9, 1.0)


def test_each_window_is_reported_once() -> None:
    bracket = Bracket(size=2, gap=2)
    steps = [(0, BASELINE, 1.0), (1, BASELINE, 1.0)] + [(s, STITCHED, 0.5) for s in range(2, 12)]
    steps += [(12, BASELINE, 1.0), (13, BASELINE, 1.0)] + [(s, STITCHED, 0.5) for s in range(14, 20)]
    assert len(feed(bracket, steps)) == 2


def test_median_noise_grows_with_spread_and_shrinks_with_samples() -> None:
    assert median_noise([], [1.0]) == 0.0
    assert median_noise([1.0] * 8, [1.0] * 8) == 0.0
    wide = median_noise([0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])
    assert wide > median_noise([0.0, 1.0, 2.0, 3.0] * 4, [1.0, 2.0, 3.0, 4.0] * 4) > 0.0
