"""Telemetry windows: a job's steps grouped into StepWindow rows, with the latest baseline and stitched medians.

Input: per step, its number, mode (`schedule`: warmup, baseline, probe, reference, stitched, reverted),
duration, whether it was timed (check steps are not) and its shape signature (the key of the shapes its
sources had, "" with static shapes, None when unknown). The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from stitchfleet.plugin.control.schedule import BASELINE, PROBE, REFERENCE, STITCHED

MIN_BASELINE_STEPS = 3  # timed baseline steps of a signature its stitched steps are compared with
# A block's first steps after a switch from the twin pay the switch: no steps of plain TF, so no part of the reference;
# their excess is the stitched side's cost. TF's steps stay slow ~5 steps after stitched ones (session 50, the MLP:
# +20%, +8%, +8%, +6%, +6% at a block's 1st-5th; with 2 of 5 left out its report stood 1.0 s above the clock)
SETTLE_STEPS = 5
# A plain TF step stays slow ~0.2-0.3 s into a baseline block, not 5 steps: the MLP's (1.3 ms) steps after stitched
# ones ran +13-18% over a plain process's for 200 steps, then within 1-5% of it (session 54; so do a process's first
# steps). A paired block (10 steps) never gets there: its mean stood 5-16% above plain processes (sessions 50-53).
# So the settle block's steps past SETTLE_SECONDS, once MIN_CALM_STEPS, are the most a step's reference may be.
SETTLE_SECONDS = 0.3
MIN_CALM_STEPS = 20


@dataclass(frozen=True)
class Window:
    index: int
    mode: str
    first_step: int
    last_step: int
    seconds: tuple[float, ...]
    baselines: tuple[float | None, ...]  # per step: plain TF's mean step at its signature (None: no figure)
    signatures: tuple[str | None, ...] = ()  # per step: its signature
    noise: float = 0.0  # the standard error of the window's saving against its paired baseline, in seconds
    own: tuple[float, ...] = ()  # per step: the plugin's own work on it, outside `seconds` (`Controller.step_done`)
    switch: float = 0.0  # the block after it: its first steps' seconds beyond the reference (switching back to TF)

    @property
    def spent(self) -> float:
        """What the window's steps cost the job: their seconds and the plugin's own work on them."""
        return sum(self.seconds) + sum(self.own)

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
        """Plain TF's mean step at each step's signature minus the step's time and the plugin's own work on it,
        summed over the window's steps that have one (negative when slower), less the switch back to the user's
        graph after it (`switch`), whatever its noise: the report claims a task's saving only when its interval
        over all its paired windows excludes zero (`telemetry.paired`); 0 outside stitched windows."""
        if self.row_mode != STITCHED:
            return 0.0
        own = self.own or (0.0,) * len(self.seconds)
        pairs = zip(self.baselines, self.seconds, own, strict=True)
        return sum(b - s - o for b, s, o in pairs if b is not None) - self.switch


@dataclass
class _Held:
    """A closed stitched (or probe) window waiting for the baseline block after it."""

    index: int
    mode: str
    first: int
    seconds: tuple[float, ...]
    signatures: tuple[str | None, ...]
    timed: tuple[tuple[float, str | None], ...]
    own: tuple[float, ...]
    leading: int = 0  # its first steps timed, before any untimed one (a block's first steps after a switch)


@dataclass
class Windows:
    """Groups steps into telemetry windows, pairs each stitched window with the baseline blocks on either side
    of it, and keeps the latest baseline and stitched medians."""

    size: int
    index: int = 0
    mode: str = ""
    first: int = 0
    seconds: list[float] = field(default_factory=list)
    signatures: list[str | None] = field(default_factory=list)
    timed: list[tuple[float, str | None]] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    leading: int = 0  # the open window's first steps that were timed, in a row
    baseline_median: float | None = None
    by_signature: dict[str | None, float] = field(default_factory=dict)  # the last baseline block's medians
    samples: dict[str | None, list[float]] = field(default_factory=dict)  # and its timed steps, per signature
    stitched_median: float | None = None
    since_baseline: list[float] = field(default_factory=list)  # timed stitched steps since the last baseline
    block: list[tuple[float, str | None]] = field(default_factory=list)  # the last block's settled timed steps
    held: list[_Held] = field(default_factory=list)  # stitched windows since that block, waiting for the next
    last_mode: str = ""  # the mode of the window closed last (consecutive baseline windows make one block)
    step_mode: str = ""  # the mode of the last step added
    elapsed: float = 0.0  # seconds of the open baseline block's steps so far (`calm`)
    settling: list[tuple[float, str | None]] = field(default_factory=list)  # its timed steps past SETTLE_SECONDS
    calm: dict[str | None, list[float]] = field(default_factory=dict)  # the last such block's, per signature
    # Over the job's steady stitched windows (probes left out), paired: their saving and the plain TF seconds it is
    # a share of (`steady_gain`), what the job's next run weighs its setup against (`setup_record.Measured`).
    steady_saved: float = 0.0
    steady_compared: float = 0.0
    steady_steps: int = 0
    steady_variance: float = 0.0  # the sum of those windows' squared standard errors (seconds squared)

    @property
    def usual(self) -> float | None:
        """A usual step of the user's graph: the last baseline block's median, or the open baseline window's
        while the first block is still open (a step right after it comes before its close)."""
        if self.mode == BASELINE and self.timed and not self.block:
            return statistics.median(seconds for seconds, _ in self.timed)
        return self.baseline_median

    def add(
        self, step: int, mode: str, seconds: float, timed: bool, signature: str | None = "", *, own: float = 0.0
    ) -> list[Window]:
        """Adds one step (`own`: the plugin's work on it beyond `seconds`, never part of a baseline); returns the
        windows ready (a stitched window once the baseline block after it closed)."""
        ready = self._close() if self.seconds and mode != self.mode else []
        if not self.seconds:
            self.mode, self.first = mode, step
        if mode == BASELINE:
            if self.step_mode != BASELINE:
                self.elapsed, self.settling = 0.0, []
            if timed and self.elapsed >= SETTLE_SECONDS:
                self.settling.append((seconds, signature))
            self.elapsed += seconds
        self.step_mode = mode
        self.seconds.append(seconds)
        self.own.append(own)
        self.signatures.append(signature)
        if timed:
            self.timed.append((seconds, signature))
        if timed and self.leading == len(self.seconds) - 1:
            self.leading += 1
        if len(self.seconds) >= self.size:
            ready += self._close()
        return ready

    def close(self) -> list[Window]:
        """At the end of the job: the open window and every stitched window still waiting, compared with the
        baseline block before them only (no block came after them)."""
        ready = self._close()
        ready += [self._paired(held, list(self.block), None) for held in self.held]
        self.held = []
        return sorted(ready, key=lambda window: window.index)

    def _close(self) -> list[Window]:
        """Ends the open window: a baseline block releases the stitched windows held since the block before."""
        if not self.seconds:
            return []
        held = _Held(
            self.index,
            self.mode,
            self.first,
            tuple(self.seconds),
            tuple(self.signatures),
            tuple(self.timed),
            tuple(self.own),
            self.leading,
        )
        self.index += 1
        self.seconds, self.signatures, self.timed, self.own, self.leading = [], [], [], [], 0
        timed = [seconds for seconds, _ in held.timed]
        if held.mode == STITCHED and timed:
            # every stitched step since the baseline it is compared with: one noisy window is not
            # enough to revert a job, and a real slowdown only gains evidence as windows close
            self.since_baseline += timed
            self.stitched_median = statistics.median(self.since_baseline)
        switched = self.last_mode in (PROBE, REFERENCE, STITCHED)  # from the twin to the user's graph, or back
        contiguous, self.last_mode = self.last_mode == held.mode, held.mode
        if held.mode in (PROBE, REFERENCE, STITCHED):
            self.held.append(held)
            return []
        if held.mode != BASELINE:
            return [self._window(held, {}, {})]
        first, settled = _settle(held, switched)
        if len(self.settling) >= MIN_CALM_STEPS:
            self.calm = {
                key: steps for key, steps in _samples(self.settling).items() if len(steps) >= MIN_BASELINE_STEPS
            }
        block = [*self.block, *settled] if contiguous else settled
        base = [*self.block, *settled]
        last = self.held[-1] if self.held else None  # the window the switch to this block came from
        ready = [self._paired(waiting, base, (first, settled) if waiting is last else None) for waiting in self.held]
        self.held, self.block = [], block
        if timed:
            self.baseline_median = statistics.median(seconds for seconds, _ in block)
            self.by_signature, self.samples = _medians(block), _samples(block)
            self.since_baseline = []
        return [*ready, self._window(held, _means(block), {})]

    def _paired(
        self,
        held: _Held,
        base: list[tuple[float, str | None]],
        after: tuple[list[tuple[float, str | None]], list[tuple[float, str | None]]] | None,
    ) -> Window:
        """`held` against the settled timed baseline steps around it, per signature, with the noise of that
        difference. The reference is their mean, not their median: a window's saving sums its own steps, slow ones
        included, so only the baseline's mean step is what plain TF would have spent on them; and at most the
        calm steps' mean (`calm`), with their noise then. `after`: the timed steps of the block after it (None: no
        block came right after it), those that paid the switch back to the user's graph (SETTLE_STEPS) and the
        rest: the former's excess over the reference is the window's cost, and the rest's too where calm steps
        cap the reference (docs/plugin/control.md)."""
        means, samples, found = _means(base), _samples(base), _samples(list(held.timed))
        capped = {key for key, steps in self.calm.items() if key in means and statistics.fmean(steps) < means[key]}
        for key in capped:
            means[key], samples[key] = statistics.fmean(self.calm[key]), self.calm[key]
        noise: dict[str | None, float] = {}
        for key, steps in found.items():
            if key in means and key in samples:
                noise[key] = mean_noise(steps, samples[key])
        first, rest = after or ([], [])
        switched = [*first, *(step for step in rest if step[1] in capped)]
        back = [(seconds - means[key], key) for seconds, key in switched if key in means]
        window = self._window(held, means, noise)
        if back:  # each such step is one step's spread (its own noise) beyond the reference's
            spread = sum(statistics.variance(samples[k]) for _, k in back if len(samples[k]) > 1)
            total = sum(excess for excess, _ in back)
            window = replace(window, switch=total, noise=(window.noise**2 + spread) ** 0.5)
        if held.mode == STITCHED:
            compared = [b for b in window.baselines if b is not None]
            self.steady_saved += window.saved_seconds
            self.steady_compared += sum(compared)
            self.steady_steps += len(compared)
            self.steady_variance += window.noise**2
        return window

    @property
    def steady_gain(self) -> float | None:
        """The share of plain TF's step the steady stitched steps saved (negative: lost), the plugin's own work on
        them included; None before any was paired."""
        return self.steady_saved / self.steady_compared if self.steady_compared > 0 else None

    @property
    def steady_noise(self) -> float:
        """`steady_gain`'s standard error, a share of plain TF's step: the windows' errors summed in variance, the
        variance doubled because neighbouring windows share a baseline block (as the report's interval does)."""
        return (2.0 * self.steady_variance) ** 0.5 / self.steady_compared if self.steady_compared > 0 else 0.0

    @staticmethod
    def _window(held: _Held, references: dict[str | None, float], noise: dict[str | None, float]) -> Window:
        last = held.first + len(held.seconds) - 1
        baselines = tuple(references.get(signature) for signature in held.signatures)
        counts = {key: held.signatures.count(key) for key in noise}
        error = sum((counts[key] * e) ** 2 for key, e in noise.items()) ** 0.5
        return Window(
            held.index, held.mode, held.first, last, held.seconds, baselines, held.signatures, error, held.own
        )


def _settle(held: _Held, switched: bool) -> tuple[list[tuple[float, str | None]], list[tuple[float, str | None]]]:
    """A baseline window's timed steps split into its first SETTLE_STEPS after a switch from the twin (none when
    it follows no twin step, or when its first step was not timed: that step paid the switch) and the rest; a
    window with no step past them keeps them all (a figure, as before, with nothing to charge)."""
    count = min(SETTLE_STEPS, held.leading) if switched else 0
    if count >= len(held.timed):
        return [], list(held.timed)
    return list(held.timed[:count]), list(held.timed[count:])


def _samples(timed: list[tuple[float, str | None]]) -> dict[str | None, list[float]]:
    """The timed steps per known signature."""
    found: dict[str | None, list[float]] = {}
    for seconds, signature in timed:
        if signature is not None:
            found.setdefault(signature, []).append(seconds)
    return found


def _medians(timed: list[tuple[float, str | None]]) -> dict[str | None, float]:
    """Per known signature with MIN_BASELINE_STEPS timed steps at least (any, when it is the only one), their
    median: the usual step the slowdown guard and the check budget read."""
    return {key: statistics.median(steps) for key, steps in _enough(timed).items()}


def _means(timed: list[tuple[float, str | None]]) -> dict[str | None, float]:
    """Per known signature with MIN_BASELINE_STEPS timed steps at least (any, when it is the only one), their
    mean: the reference a window's saving is measured against."""
    return {key: statistics.fmean(steps) for key, steps in _enough(timed).items()}


def _enough(timed: list[tuple[float, str | None]]) -> dict[str | None, list[float]]:
    """The timed steps per known signature that has a figure (see `_medians`)."""
    found = _samples(timed)
    if len(found) == 1:  # one signature (static shapes: ""): a figure however few its steps
        return found
    return {key: steps for key, steps in found.items() if len(steps) >= MIN_BASELINE_STEPS}


def mean_noise(first: Sequence[float], second: Sequence[float]) -> float:
    """The standard error of mean(first) - mean(second) (each sample's variance over its size; a sample of one
    step has no spread of its own to add); 0 when one is empty."""
    if not first or not second:
        return 0.0
    variance = sum(statistics.variance(steps) / len(steps) for steps in (first, second) if len(steps) > 1)
    return float(variance**0.5)
