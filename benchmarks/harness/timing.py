"""How a figure is taken: warm-up, repetitions per sample, interleaved samples, medians.

Input: named `Variant`s (a call, a way to wait for its result, a reader of its outputs)
and a `sample` function from the runner (CUDA events on the GPU, the wall clock on the
CPU dry run) that times `reps` back-to-back calls and returns seconds per call.
Output: a `Timing` per variant. Every variant is warmed up first; `reps` is chosen
once per case so the fastest variant's sample lasts about `target_s` (short kernels
are then not measured as launch latency alone), the same for all variants; samples
are interleaved (variant order rotates every round) so drift hits all alike.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Variant:
    name: str
    call: Callable[[], object]
    finish: Callable[[object], None]  # waits until the call's device work is done
    read: Callable[[], Mapping[str, npt.NDArray[Any]]]  # outputs by graph output name, host arrays
    kernels: int | None = None  # launches per call, where we know them


Sampler = Callable[[Variant, int], float]  # (variant, reps) -> seconds per call


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    samples: int
    reps: int

    def to_json(self) -> dict[str, float | int]:
        return {
            "median_s": self.median_s,
            "p10_s": self.p10_s,
            "p90_s": self.p90_s,
            "samples": self.samples,
            "reps": self.reps,
        }


def run_once(variant: Variant) -> None:
    variant.finish(variant.call())


def choose_reps(sample: Sampler, variants: list[Variant], target_s: float, max_reps: int = 1000) -> int:
    """Calls per sample so that the fastest variant's sample lasts about target_s."""
    fastest = min(sample(v, 1) for v in variants)
    return max(1, min(max_reps, math.ceil(target_s / max(fastest, 1e-9))))


def summarise(times: list[float], reps: int) -> Timing:
    q = np.quantile(np.asarray(times), [0.1, 0.9])
    return Timing(statistics.median(times), float(q[0]), float(q[1]), len(times), reps)


def measure(sample: Sampler, variants: list[Variant], runs: int, warmup: int, target_s: float) -> dict[str, Timing]:
    """Median of `runs` interleaved samples per variant, after `warmup` untimed calls of each."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    for v in variants:
        for _ in range(warmup):
            run_once(v)
    reps = choose_reps(sample, variants, target_s)
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for r in range(runs):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            times[v.name].append(sample(v, reps))
    return {name: summarise(ts, reps) for name, ts in times.items()}
