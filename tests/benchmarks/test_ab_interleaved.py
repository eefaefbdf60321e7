"""benchmarks/ab_interleaved.py without TensorFlow: the chunks' order with and without the control (plain TF's
second session), and the noise the control sets when two identical sessions differ by more than their chunks' spread."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import ab_interleaved
from benchmarks.ab_interleaved import Side


class _Session:
    """Stops after `steps` runs; each run logs the side's name."""

    def __init__(self, name: str, steps: int, log: list[str]) -> None:
        self.name, self.left, self.log = name, steps, log

    def should_stop(self) -> bool:
        return self.left <= 0

    def run(self, fetches: Any, feeds: Any) -> list[float]:
        self.left -= 1
        self.log.append(self.name)
        return [1.0]


class _Graph:
    def as_default(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


def _side(name: str, steps: int, log: list[str]) -> Side:
    return Side(_Session(name, steps, log), _Graph(), [], {})


def test_two_sides_alternate_abba_and_three_rotate() -> None:
    log: list[str] = []
    ab_interleaved.alternate(_side("p", 40, log), _side("q", 40, log), 40)
    assert log[:: ab_interleaved.MIN_CHUNK] == ["p", "q", "q", "p", "p", "q", "q", "p"]
    log = []
    ab_interleaved.alternate(_side("p", 30, log), _side("q", 30, log), 30, _side("c", 30, log))
    assert log[:: ab_interleaved.MIN_CHUNK] == ["p", "q", "c", "q", "c", "p", "c", "p", "q"]


def _timed(chunks: list[list[float]]) -> Side:
    side = Side(None, None, [], {})
    side.chunks, side.losses = chunks, [2.0, 1.0]
    return side


def test_the_control_sets_the_noise_when_two_identical_sessions_differ_more_than_their_chunks() -> None:
    # plain chunks alternate 1.0/1.1 s (spread of adjacent sums: 0.1), the control's are 0.1 s slower each
    plain = _timed([[0.5, 0.5], [0.5, 0.6], [0.5, 0.5], [0.5, 0.6], [0.5, 0.5]])
    plugin = _timed([[0.4, 0.4]] * 5)
    control = _timed([[0.6, 0.5], [0.6, 0.6], [0.6, 0.5], [0.6, 0.6], [0.6, 0.5]])
    alone = ab_interleaved.figures(plain, plugin)
    both = ab_interleaved.figures(plain, plugin, control)
    assert alone["difference"] == both["difference"] == pytest.approx(5.2 - 4.0)
    assert "control_difference" not in alone
    assert both["control_difference"] == pytest.approx(-0.5)
    assert alone["noise"] == pytest.approx(0.11547 * 5**0.5, rel=1e-3)  # stdev of [0.1, -0.1, 0.1] x sqrt 5 pairs
    assert alone["noise"] < 0.5
    assert both["noise"] == pytest.approx(0.5)
    quiet = _timed([[0.5, 0.5], [0.5, 0.6], [0.5, 0.5], [0.5, 0.6], [0.5, 0.5]])
    assert ab_interleaved.figures(plain, plugin, quiet)["noise"] == pytest.approx(alone["noise"])
