"""One job in one process, plain TF and under the plugin (and plain TF again: the control), alternated by chunks.

Input: the job's MonitoredSessions (`Side`), its length. Output: per side its steps' seconds and steady step, and
the chunk pairs' figures: the plugin's steady step against plain TF's (ratio per pair of adjacent chunks), the
measured difference of the steps' seconds with its noise. Between processes this machine's steady step moves by
10-25% (benchmarks/README.md, "Session 25"); adjacent chunks of one process share that state and most of its load.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Chunks per side over a whole job: short enough that a drift of the machine's speed moves both sides of a pair alike,
# long enough that a chunk's switch (the other session's caches) is a small part of it.
CHUNKS = 60
MIN_CHUNK = 10


@dataclass
class Side:
    """One session of the pair: its job's ops, its step times per chunk."""

    session: Any
    graph: Any
    fetches: list[Any]
    feeds: dict[Any, Any]
    chunks: list[list[float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def run(self, steps: int) -> None:
        """Up to `steps` steps (fewer when the job's StopAtStepHook ends it) as one chunk."""
        times = []
        with self.graph.as_default():  # a hook that reads the default graph finds this job's
            for _ in range(steps):
                if self.session.should_stop():
                    break
                began = time.perf_counter()
                value = self.session.run(self.fetches, self.feeds)[0]
                times.append(time.perf_counter() - began)
                self.losses.append(float(value))
        if times:
            self.chunks.append(times)

    @property
    def done(self) -> bool:
        return bool(self.session.should_stop())


def chunk_steps(steps: int) -> int:
    """Steps per chunk for a job of `steps` steps (`CHUNKS`)."""
    return max(MIN_CHUNK, steps // CHUNKS)


def alternate(plain: Side, plugin: Side, steps: int, control: Side | None = None) -> None:
    """Runs the sides to their end in chunks; the side that goes first rotates every round of chunks (ABBA for two
    sides), so none always runs just after the switch."""
    chunk, pair = chunk_steps(steps), 0
    sides = [plain, plugin] if control is None else [plain, plugin, control]
    while not all(side.done for side in sides):
        first = pair % len(sides)
        for side in sides[first:] + sides[:first]:
            side.run(chunk)
        pair += 1


def figures(plain: Side, plugin: Side, control: Side | None = None) -> dict[str, Any]:
    """The pair's figures (module docstring). `ratio`: over the last half of the chunk pairs, the median of each
    pair's plugin chunk median step over its plain chunk's, with the middle half of those ratios; `difference`: plain
    TF's steps' seconds minus the plugin's over the pairs both ran in full (the plugin's saving, setup in the steps
    and its own work included); `noise`: that difference's standard error when the plugin changes nothing, from
    plain TF against itself: the spread of adjacent plain chunks' sums (a pair's two chunks are as far apart), x
    sqrt(pairs); with the `control` (plain TF's second session), at least the difference between plain TF's two
    sessions over the same chunks (`control_difference`): an offset between two identical sessions, which the
    chunks' spread does not show, is noise too."""
    pairs = [(p, q) for p, q in zip(plain.chunks, plugin.chunks, strict=False) if len(p) == len(q)]
    late = pairs[len(pairs) // 2 :]
    ratios = sorted(statistics.median(q) / statistics.median(p) for p, q in late)
    sums = [sum(p) for p, _ in pairs[1:]]  # the first chunk holds the session's first run (its executor's build)
    moves = [b - a for a, b in itertools.pairwise(sums)]
    noise = statistics.stdev(moves) * math.sqrt(len(pairs)) if len(moves) > 1 else float("nan")
    offset: dict[str, Any] = {}
    if control is not None:
        twins = [(p, c) for p, c in zip(plain.chunks, control.chunks, strict=False) if len(p) == len(c)]
        difference = sum(sum(p) - sum(c) for p, c in twins) * len(pairs) / max(len(twins), 1)  # over as many pairs
        offset = {"control_difference": difference}
        noise = max(noise, abs(difference))

    def steady(side: Side) -> float:
        times = [t for chunk in side.chunks for t in chunk]
        return statistics.median(times[len(times) // 2 :])

    return {
        "plain_steps_seconds": sum(map(sum, plain.chunks)),
        "steps_seconds": sum(map(sum, plugin.chunks)),
        "plain_steady": steady(plain),
        "steady": steady(plugin),
        "ratio": [statistics.median(ratios), ratios[len(ratios) // 4], ratios[(3 * len(ratios) - 1) // 4]],
        "pairs": len(pairs),
        "difference": sum(sum(p) - sum(q) for p, q in pairs),
        "noise": noise,
        **offset,
        "plain_losses": [plain.losses[0], plain.losses[-1]],
        "losses": [plugin.losses[0], plugin.losses[-1]],
    }


def agrees(run: dict[str, Any], difference: float, noise: float, width: float = 2.0) -> str:
    """Whether a plugin run's report agrees with the clock: `difference` (plain TF's steps' seconds minus the run's)
    lies in the report's interval of the saving, less the setup it booked from steps and its plugin overhead (both
    spent in the steps), widened by `width` times the difference's `noise` (2: a noise from many chunk pairs, as
    here). ab_jobs judges its runs of separate processes with it too, its width Student's t for the rounds its noise
    is measured over."""
    low, high = run["interval"]
    if not math.isfinite(low):  # no interval: nothing is claimed, so the clock must show no saving beyond noise
        low = high = 0.0
    booked = run["setup_from_steps"] + run.get("overhead", 0.0)
    low, high = low - booked - width * noise, high - booked + width * noise
    return "yes" if low <= difference <= high else f"no ({difference:+.2f})"


def table(results: dict[str, list[dict[str, Any]]], claimed: Callable[[dict[str, Any]], str]) -> list[str]:
    """The one-process table: per job, per round, the pair's figures. `claimed` formats a run's claim as ab_jobs'
    main table does."""
    lines = [
        "| job | round | plain steady ms | plugin steady ms | plugin vs plain, last half: chunk pairs' median"
        " (middle half; pairs) | measured saving s: plain - plugin steps (noise; plain - plain again)"
        " | claimed net s (gross, 95% interval) | clock in the claim's interval (2x noise)"
        " | losses plain / plugin (last) | decided |",
        "|---|---:|---:|---:|---|---|---|---|---|---|",
    ]
    for job, runs in results.items():
        for r, run in enumerate(runs):
            if "error" in run:
                lines.append(f"| {job} | {r + 1} | ({run['error']}) ||||||||")
                continue
            median, low, high = run["ratio"]
            again = f"; {run['control_difference']:+.2f}" if "control_difference" in run else ""
            lines.append(
                f"| {job} | {r + 1} | {run['plain_steady'] * 1e3:.2f} | {run['steady'] * 1e3:.2f}"
                f" | {median:.3f}x ({low:.3f}-{high:.3f}; {run['pairs']})"
                f" | {run['difference']:+.2f} ({run['noise']:.2f}{again})"
                f" | {claimed(run)} | {agrees(run, run['difference'], run['noise'])}"
                f" | {run['plain_losses'][1]:.5f} / {run['losses'][1]:.5f}"
                f" | {run.get('decided', '')} |"
            )
    return lines
