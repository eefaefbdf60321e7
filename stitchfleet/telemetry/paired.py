"""A task's saving from paired windows, with its confidence interval and whether it is claimed: no SQL.

Input: sums over a task-week's windows (`PairedSums`: plain sums, so the store keeps them by differences).
Output: `claim(sums)`, the measured saving, its 95% interval and the claimed saving (the measured one when
the interval excludes zero, else 0: "within noise"). The method in full: docs/plugin/control.md (step_windows).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

STITCHED = "stitched"
BASELINE = "baseline"
# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; beyond, a close series in 1/df.
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
SHARED_BLOCKS = 2.0  # neighbouring stitched windows share the baseline block between them: variance at most x2


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` >= 1 degrees of freedom (3 decimals)."""
    if df < 1:
        raise ValueError(f"df={df}: expected >= 1")
    return T_975[df - 1] if df <= len(T_975) else 1.95996 + 2.37227 / df + 2.82 / df**2


@dataclass(frozen=True)
class PairedSums:
    """Sums over one task-week's windows. Paired windows are stitched windows with a baseline (the blocks
    around them): per such window w, n_w its steps, P_w its saved seconds (baseline minus its steps' time),
    S_w its steps' seconds."""

    paired_windows: int = 0  # m
    paired_steps: int = 0  # sum n_w
    paired_step_seconds: float = 0.0  # sum S_w
    saved_square: float = 0.0  # sum P_w^2
    saved_by_steps: float = 0.0  # sum P_w n_w
    steps_square: float = 0.0  # sum n_w^2
    baseline_windows: int = 0  # the baseline windows (blocks) those windows were paired with

    @classmethod
    def made(cls, values: Sequence[float | None]) -> PairedSums:
        """From its figures in field order (None: 0), the counts rounded (sums kept by differences drift)."""
        found = [value or 0 for value in values]
        counts = (round(found[0]), round(found[1]), round(found[6]))
        return cls(counts[0], counts[1], found[2], found[3], found[4], found[5], counts[2])

    @classmethod
    def of(cls, row: Any) -> PairedSums:
        """From a task_weeks row (a mapping or an object with those attributes)."""
        get = row.__getitem__ if isinstance(row, Mapping) else lambda name: getattr(row, name)
        return cls.made([get(name) for name in FIELDS])

    @classmethod
    def windows(cls, rows: Iterable[tuple[str, int, float, float | None, float]]) -> PairedSums:
        """From windows as (mode, iterations, step_seconds_sum, baseline_step_seconds, saved_seconds)."""
        totals = [0.0] * len(FIELDS)
        for mode, n, seconds, baseline, saved in rows:
            for index, value in enumerate(contribution(mode, n, seconds, baseline, saved)):
                totals[index] += value
        return cls.made(totals)

    def values(self) -> dict[str, float]:
        """Its figures by field name (task_weeks columns)."""
        return {name: getattr(self, name) for name in FIELDS}


FIELDS = tuple(item.name for item in fields(PairedSums))


def contribution(
    mode: str, n: int, seconds: float, baseline: float | None, saved: float
) -> tuple[int, int, float, float, float, float, int]:
    """What one window adds to `PairedSums`, field by field (zeros for a window that is not paired)."""
    if mode == BASELINE:
        return (0, 0, 0.0, 0.0, 0.0, 0.0, 1)
    if mode != STITCHED or baseline is None:
        return (0, 0, 0.0, 0.0, 0.0, 0.0, 0)
    return (1, n, seconds, saved * saved, saved * n, float(n * n), 0)


@dataclass(frozen=True)
class Claim:
    """A task-week's saving in rank-seconds: measured (every paired window's), its 95% interval, claimed."""

    measured: float
    low: float
    high: float
    claimed: float

    @property
    def within_noise(self) -> bool:
        """A saving was measured, but its interval holds zero: none is claimed."""
        return self.claimed == 0.0 and self.measured != 0.0


def claim(sums: PairedSums, saved: float) -> Claim:
    """`saved` (the week's saved seconds) with its interval from the paired windows' sums; claimed only when
    the interval excludes zero. Fewer than 3 paired windows give no interval (nothing claimed).

    The interval: the total over paired windows T = sum P_w; per window, its residual from the task's per-step
    difference d = T / sum n_w is r_w = P_w - n_w d; Var(T) = m / (m - 1) sum r_w^2 (windows as independent
    clusters), times SHARED_BLOCKS (a block is the baseline of the windows on both sides of it) and times the
    stitched windows per baseline block (windows between the same blocks share their baseline); T +- t(m-1)
    standard errors."""
    m = sums.paired_windows
    if m < 3 or sums.paired_steps <= 0:
        return Claim(saved, -math.inf, math.inf, 0.0)
    d = saved / sums.paired_steps
    residuals = sums.saved_square - 2.0 * d * sums.saved_by_steps + d * d * sums.steps_square
    per_block = max(1.0, m / sums.baseline_windows) if sums.baseline_windows else float(m)
    variance = max(residuals, 0.0) * m / (m - 1) * SHARED_BLOCKS * per_block
    half = t_quantile(m - 1) * math.sqrt(variance)
    low, high = saved - half, saved + half
    return Claim(saved, low, high, saved if low > 0.0 or high < 0.0 else 0.0)


def paired_means(sums: PairedSums, saved: float) -> tuple[float | None, float | None]:
    """(baseline, stitched) seconds per paired step: what the blocks around the stitched windows took, and what
    those windows took; (None, None) without paired steps."""
    if sums.paired_steps <= 0:
        return None, None
    stitched = sums.paired_step_seconds / sums.paired_steps
    return stitched + saved / sums.paired_steps, stitched
