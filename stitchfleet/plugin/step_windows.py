"""Telemetry windows: a job's steps grouped into StepWindow rows, with the latest baseline and stitched medians.

Input: per step, its number, mode (`schedule`: warmup, baseline, probe, reference, stitched, reverted),
duration and whether it was timed (check steps are not). Output: closed `Window`s with the figures a
StepWindow row needs (saved seconds against the current baseline median), and the medians the slowdown
guard and the check budget read (`Windows.baseline_median`, `Windows.stitched_median`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from stitchfleet.plugin.schedule import BASELINE, PROBE, REFERENCE, STITCHED


@dataclass(frozen=True)
class Window:
    index: int
    mode: str
    first_step: int
    last_step: int
    seconds: tuple[float, ...]
    baseline: float | None

    @property
    def iterations(self) -> int:
        return len(self.seconds)

    @property
    def row_mode(self) -> str:
        """The StepWindow mode: both halves of a cluster's probe pair run stitched clusters, and are booked so."""
        return STITCHED if self.mode in (PROBE, REFERENCE) else self.mode

    @property
    def saved_seconds(self) -> float:
        """Baseline median minus step time, summed over the window (negative when slower)."""
        if self.row_mode != STITCHED or self.baseline is None:
            return 0.0
        return self.baseline * self.iterations - sum(self.seconds)


@dataclass
class Windows:
    """Groups steps into telemetry windows and keeps the latest baseline and stitched medians."""

    size: int
    index: int = 0
    mode: str = ""
    first: int = 0
    seconds: list[float] = field(default_factory=list)
    timed: list[float] = field(default_factory=list)
    baseline_median: float | None = None
    stitched_median: float | None = None
    since_baseline: list[float] = field(default_factory=list)  # timed stitched steps since the last baseline

    def add(self, step: int, mode: str, seconds: float, timed: bool) -> list[Window]:
        """Adds one step; returns the windows it closed (on a mode change, and when full)."""
        closed = [w for w in [self.close()] if w is not None] if self.seconds and mode != self.mode else []
        if not self.seconds:
            self.mode, self.first = mode, step
        self.seconds.append(seconds)
        if timed:
            self.timed.append(seconds)
        if len(self.seconds) >= self.size:
            closed += [w for w in [self.close()] if w is not None]
        return closed

    def close(self) -> Window | None:
        """Ends the open window (also at the end of the job)."""
        if not self.seconds:
            return None
        if self.timed and self.mode == BASELINE:
            self.baseline_median = statistics.median(self.timed)
            self.since_baseline = []
        if self.timed and self.mode == STITCHED:
            # every stitched step since the baseline it is compared with: one noisy window is not
            # enough to revert a job, and a real slowdown only gains evidence as windows close
            self.since_baseline += self.timed
            self.stitched_median = statistics.median(self.since_baseline)
        last = self.first + len(self.seconds) - 1
        window = Window(self.index, self.mode, self.first, last, tuple(self.seconds), self.baseline_median)
        self.index += 1
        self.seconds, self.timed = [], []
        return window
