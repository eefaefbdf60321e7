"""The job-level slowdown guard's figures: baseline blocks against the stitched steps around them.

Input: per step, its number, mode (baseline or stitched; others are ignored) and duration, only for timed
steps (check steps are not timed). Output: (stitched median, baseline median, noise) once enough baseline
blocks with their brackets are pooled; `JobCourse.slowed` judges them. The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from stitchfleet.plugin.control.schedule import BASELINE, STITCHED, median_noise

Figures = tuple[float, float, float]  # stitched median, baseline median, noise (seconds)


@dataclass
class Bracket:
    """See the module docstring. `size`: timed steps per bracket; `gap`: most steps between a bracket's
    nearest step and the baseline window; `need`: baseline steps (a block's first included) pooled before a
    figure is ready (short baseline blocks pool with their brackets until they have that many)."""

    size: int
    gap: int
    need: int = 1
    # the pooled stitched steps, baseline steps, and per block its stitched median - its baseline median
    pooled: tuple[list[float], list[float], list[float]] = field(default_factory=lambda: ([], [], []))
    counted: int = 0  # the pooled blocks' baseline steps
    recent: deque[tuple[int, float]] = field(default_factory=deque)  # the last `size` timed stitched steps
    before: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    base_span: tuple[int, int] = (-1, -1)  # first and last step of the current baseline window
    ready: Figures | None = None

    def add(self, step: int, mode: str, seconds: float) -> None:
        """One timed step."""
        if mode == BASELINE:
            self._baseline(step, seconds)
        elif mode == STITCHED:
            self._stitched(step, seconds)

    def _baseline(self, step: int, seconds: float) -> None:
        first, last = self.base_span
        if step - last > self.gap or not self.base or self.after:  # a new baseline window
            adjacent = [s for at, s in self.recent if step - at <= self.gap + self.size]
            self.before, self.base, self.after, first = adjacent, [], [], step
        self.base.append(seconds)
        self.base_span = (first, step)

    def _stitched(self, step: int, seconds: float) -> None:
        if self.base and step == self.base_span[1] + 1:
            return  # the first step back on the twin pays the switch, as a block's first step does: not compared
        self.recent.append((step, seconds))
        while len(self.recent) > self.size:
            self.recent.popleft()
        if not self.base or len(self.after) >= self.size:
            return
        if not self.after and step - self.base_span[1] > self.gap:
            self.base = []  # no stitched step close after it: this window is not compared
            return
        self.after.append(seconds)
        if len(self.after) == self.size:
            stitched, base, blocks = self.pooled
            settled = self.base[1:] or self.base  # the block's first step pays the switch from the twin
            stitched += self.before + self.after
            base += settled
            blocks.append(statistics.median(self.before + self.after) - statistics.median(settled))
            self.counted += len(self.base)
            if self.counted >= self.need:  # the blocks' differences vary with the machine's state, no spread shows it
                between = statistics.stdev(blocks) / len(blocks) ** 0.5 if len(blocks) > 1 else 0.0
                noise = max(median_noise(stitched, base), between)
                self.ready = (statistics.median(stitched), statistics.median(base), noise)
                self.pooled, self.counted = ([], [], []), 0

    def take(self) -> Figures | None:
        """The figures of the baseline windows just bracketed, once; None when there is nothing new."""
        ready, self.ready = self.ready, None
        return ready
