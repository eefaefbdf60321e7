"""Telemetry windows: a job's steps grouped into StepWindow rows, with the latest baseline and stitched medians.

Input: per step, its number, mode (`schedule`: warmup, baseline, probe, reference, stitched, reverted),
duration, whether it was timed (check steps are not) and its shape signature (the key of the shapes its
sources had, "" with static shapes, None when unknown). The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from stitchfleet.plugin.control.schedule import BASELINE, PROBE, REFERENCE, STITCHED, median_noise

MIN_BASELINE_STEPS = 3  # timed baseline steps of a signature its stitched steps are compared with
NOISE_FACTOR = 2.0  # standard errors a window's difference from its baseline must exceed to be claimed


@dataclass(frozen=True)
class Window:
    index: int
    mode: str
    first_step: int
    last_step: int
    seconds: tuple[float, ...]
    baselines: tuple[float | None, ...]  # per step: plain TF's median at its signature (None: no figure)
    signatures: tuple[str | None, ...] = ()  # per step: its signature (with `claimed`)
    claimed: frozenset[str | None] | None = None  # the signatures whose difference is beyond noise (None: all)

    @property
    def iterations(self) -> int:
        return len(self.seconds)

    @property
    def row_mode(self) -> str:
        """The StepWindow mode: both halves of a cluster's probe pair run stitched clusters, and are booked so."""
        return STITCHED if self.mode in (PROBE, REFERENCE) else self.mode

    @property
    def baseline(self) -> float | None:
        """The mean of the baselines its steps were compared with (per signature); None without any."""
        known = [b for b in self.baselines if b is not None]
        return sum(known) / len(known) if known else None

    @property
    def saved_seconds(self) -> float:
        """Plain TF's median at each step's signature minus the step's time, summed over the window's steps that
        have one (negative when slower); 0 outside stitched windows."""
        if self.row_mode != STITCHED:
            return 0.0
        signatures = self.signatures or ("",) * len(self.seconds)
        steps = zip(self.baselines, self.seconds, signatures, strict=True)
        return sum(b - s for b, s, key in steps if b is not None and (self.claimed is None or key in self.claimed))


@dataclass
class Windows:
    """Groups steps into telemetry windows and keeps the latest baseline and stitched medians."""

    size: int
    index: int = 0
    mode: str = ""
    first: int = 0
    seconds: list[float] = field(default_factory=list)
    signatures: list[str | None] = field(default_factory=list)
    timed: list[tuple[float, str | None]] = field(default_factory=list)
    baseline_median: float | None = None
    by_signature: dict[str | None, float] = field(default_factory=dict)  # the last baseline window's medians
    samples: dict[str | None, list[float]] = field(default_factory=dict)  # and its timed steps, per signature
    stitched_median: float | None = None
    since_baseline: list[float] = field(default_factory=list)  # timed stitched steps since the last baseline

    def add(self, step: int, mode: str, seconds: float, timed: bool, signature: str | None = "") -> list[Window]:
        """Adds one step; returns the windows it closed (on a mode change, and when full)."""
        closed = [w for w in [self.close()] if w is not None] if self.seconds and mode != self.mode else []
        if not self.seconds:
            self.mode, self.first = mode, step
        self.seconds.append(seconds)
        self.signatures.append(signature)
        if timed:
            self.timed.append((seconds, signature))
        if len(self.seconds) >= self.size:
            closed += [w for w in [self.close()] if w is not None]
        return closed

    def close(self) -> Window | None:
        """Ends the open window (also at the end of the job)."""
        if not self.seconds:
            return None
        timed = [seconds for seconds, _ in self.timed]
        if timed and self.mode == BASELINE:
            self.baseline_median = statistics.median(timed)
            self.by_signature = _medians(self.timed)
            self.samples = _samples(self.timed)
            self.since_baseline = []
        if timed and self.mode == STITCHED:
            # every stitched step since the baseline it is compared with: one noisy window is not
            # enough to revert a job, and a real slowdown only gains evidence as windows close
            self.since_baseline += timed
            self.stitched_median = statistics.median(self.since_baseline)
        last = self.first + len(self.seconds) - 1
        baselines = tuple(self.by_signature.get(signature) for signature in self.signatures)
        claimed = self._beyond_noise()
        signatures = tuple(self.signatures)
        window = Window(self.index, self.mode, self.first, last, tuple(self.seconds), baselines, signatures, claimed)
        self.index += 1
        self.seconds, self.signatures, self.timed = [], [], []
        return window

    def _beyond_noise(self) -> frozenset[str | None]:
        """The signatures whose timed steps in the open window differ from the baseline's beyond the noise."""
        found = _samples(self.timed)
        return frozenset(
            key
            for key, steps in found.items()
            if key in self.by_signature and key in self.samples
            and abs(statistics.median(steps) - self.by_signature[key])
            > NOISE_FACTOR * median_noise(steps, self.samples[key])
        )  # fmt: skip


def _samples(timed: list[tuple[float, str | None]]) -> dict[str | None, list[float]]:
    """The timed steps per known signature."""
    found: dict[str | None, list[float]] = {}
    for seconds, signature in timed:
        if signature is not None:
            found.setdefault(signature, []).append(seconds)
    return found


def _medians(timed: list[tuple[float, str | None]]) -> dict[str | None, float]:
    """Per known signature with MIN_BASELINE_STEPS timed steps at least (any, when it is the only one), their
    median."""
    found: dict[str | None, list[float]] = {}
    for seconds, signature in timed:
        if signature is not None:
            found.setdefault(signature, []).append(seconds)
    if len(found) == 1:  # one signature (static shapes: ""): the window's median, however few its steps
        return {key: statistics.median(steps) for key, steps in found.items()}
    return {key: statistics.median(steps) for key, steps in found.items() if len(steps) >= MIN_BASELINE_STEPS}
