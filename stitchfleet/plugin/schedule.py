"""The A/B timing schedule and the step-window bookkeeping: pure Python, the same on every rank.

Input: the guard and timing settings and, per step, its number, duration and whether it
ran checks. Output: what each step runs (`mode`: warmup, baseline with every switch off,
stitched, or reverted), whether it is a check step, and closed `Window`s with the figures
a StepWindow row needs (saved seconds against the current baseline median). Everything
is a function of the step number, so ranks that share the step count share the schedule.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from stitchfleet import settings as settings_module

WARMUP, BASELINE, STITCHED, REVERTED = "warmup", "baseline", "stitched", "reverted"


@dataclass(frozen=True)
class Timing:
    warmup_steps: int = 10
    baseline_steps: int = 20
    rebaseline_every: int = 1000
    window_steps: int = 100
    check_every: int = 100
    check_first: int = 5
    slowdown_margin: float = 0.05

    @classmethod
    def from_settings(cls, current: settings_module.Settings) -> Timing:
        return cls(
            current.warmup_steps,
            current.baseline_steps,
            current.rebaseline_every,
            current.window_steps,
            current.check_every,
            current.check_first,
            current.slowdown_margin,
        )

    @property
    def period(self) -> int:
        """Steps from one baseline window's start to the next (room for stitched steps kept)."""
        return max(self.rebaseline_every, self.baseline_steps + 1)

    def phase(self, step: int) -> str:
        """warmup, baseline or stitched, from the step number alone."""
        if step < self.warmup_steps:
            return WARMUP
        return BASELINE if (step - self.warmup_steps) % self.period < self.baseline_steps else STITCHED

    def checks(self, step: int) -> bool:
        """A stitched step that compares every enabled cluster with the fp64 reference."""
        if self.phase(step) != STITCHED:
            return False
        since_enabled = step - self.warmup_steps - self.baseline_steps
        return since_enabled < self.check_first or step % self.check_every == 0


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
    def saved_seconds(self) -> float:
        """Baseline median minus step time, summed over the window (negative when slower)."""
        if self.mode != STITCHED or self.baseline is None:
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
        if self.timed and self.mode == STITCHED:
            self.stitched_median = statistics.median(self.timed)
        last = self.first + len(self.seconds) - 1
        window = Window(self.index, self.mode, self.first, last, tuple(self.seconds), self.baseline_median)
        self.index += 1
        self.seconds, self.timed = [], []
        return window
