"""The job-level slowdown guard's figures: a baseline window against the stitched steps around it.

Input: per step, its number, mode (baseline or stitched; others are ignored) and duration, only for timed
steps (check steps are not timed). Output: (stitched median, baseline median, noise) once enough baseline
blocks with their brackets are pooled. The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from stitchfleet.plugin.control.schedule import BASELINE, STITCHED, median_noise


@dataclass
class Bracket:
    """See the module docstring. `size`: timed steps per bracket; `gap`: most steps between a bracket's
    nearest step and the baseline window; `need`: baseline steps pooled before a figure is ready (short
    baseline blocks pool with their brackets until they have that many)."""

    size: int
    gap: int
    need: int = 1
    pooled: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))  # stitched, baseline
    recent: deque[tuple[int, float]] = field(default_factory=deque)  # the last `size` timed stitched steps
    before: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    base_span: tuple[int, int] = (-1, -1)  # first and last step of the current baseline window
    ready: tuple[float, float, float] | None = None

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
            stitched, base = self.pooled
            stitched += self.before + self.after
            base += self.base
            if len(base) >= self.need:
                self.ready = (statistics.median(stitched), statistics.median(base), median_noise(stitched, base))
                self.pooled = ([], [])

    def take(self) -> tuple[float, float, float] | None:
        """The figures of the baseline window just bracketed, once; None when there is nothing new."""
        ready, self.ready = self.ready, None
        return ready
