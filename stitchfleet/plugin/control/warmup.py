"""Which warmup steps build the executors of the twin's runs, and how much of their time is setup.

Input: the number of warmup steps and, per warmup step, its duration. Output: The rules in full:
docs/plugin/control.md.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field


@dataclass
class ExecutorWarmup:
    steps: int
    samples: list[float] = field(default_factory=list)  # plain warmup steps after the first
    extra: float = 0.0
    seconds: float | None = None  # the builds' time beyond a usual step, once the last build ran

    @property
    def checks(self) -> int:
        """The warmup step that runs the twin with the check tensors (-1: none)."""
        return self.steps - 1 if self.steps >= 2 else -1

    @functools.cached_property
    def builds(self) -> frozenset[int]:
        """The warmup steps that run on the twin (asked every step: worked out once, `steps` is fixed)."""
        twin = self.steps - 2 if self.steps >= 3 else -1
        return frozenset(step for step in (twin, self.checks) if step >= 0)

    @functools.cached_property
    def last(self) -> int:
        """The last build step (-1: none): every step after it is no build and no sample."""
        return max(self.builds, default=-1)

    def timed(self, step: int, seconds: float) -> bool:
        """Takes a step's duration; True when it was the last build (`seconds` is known from then on)."""
        if step > self.last:  # most steps: past the warmup
            return False
        if 0 < step < min(self.builds):
            self.samples.append(seconds)
            return False
        if step not in self.builds:
            return False
        usual = statistics.median(self.samples) if self.samples else 0.0
        self.extra += max(seconds - usual, 0.0)
        if step != max(self.builds):
            return False
        self.seconds = self.extra
        return True
