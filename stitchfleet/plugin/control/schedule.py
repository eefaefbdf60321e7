"""The A/B timing schedule: pure Python, the same on every rank.

Input: the guard and timing settings, the number of installed clusters and, per step, its number, duration and
whether it ran checks. The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from stitchfleet import settings as settings_module

WARMUP, BASELINE, PROBE, STITCHED, REVERTED = "warmup", "baseline", "probe", "stitched", "reverted"
REFERENCE = "reference"  # the half of a cluster's probe pair without that cluster (the others on)
GROUP = -1  # the probe subject of the group phase (every cluster on), beside cluster indices 0..n-1


def median_noise(first: Sequence[float], second: Sequence[float]) -> float:
    """The standard error of median(first) - median(second), from each sample's spread (1.4826 MAD,
    robust to the odd slow step) and the 1.2533 factor of a median's error; 0 when one is empty."""
    if not first or not second:
        return 0.0
    variance = 0.0
    for steps in (first, second):
        centre = statistics.median(steps)
        spread = 1.4826 * statistics.median(abs(s - centre) for s in steps)
        variance += spread**2 / len(steps)
    return float(1.2533 * variance**0.5)


@dataclass(frozen=True)
class Timing:
    warmup_steps: int = 10
    baseline_steps: int = 20
    rebaseline_every: int = 1000
    window_steps: int = 100
    check_every: int = 100
    check_first: int = 5
    slowdown_margin: float = 0.05
    probe_steps: int = 10
    probe_margin: float = 0.01
    clusters: int = 0
    probe_rounds: int = 2
    probe_group: bool = True
    check_clusters: int = 1
    group_factor: int = 1
    check_budget: float = 1.0
    check_max_gap: int = 1000
    probe_reruns: int = 2
    probe_share: float = 0.05  # most of the job's remaining steps that exploring a losing configuration may take
    probe_min_steps: int = 3  # timed steps each half of a pair needs at its signature for figures (`Probes`)
    reruns: tuple[tuple[int, int], ...] = ()  # (first step, subject) of each rerun pair's rounds, in order
    paired_steps: int = 0  # steps of each baseline block of the stitched phase (0: baseline_steps; at most that)
    known: frozenset[int] = frozenset()  # clusters the fleet's memory decided: no probe pair of their own
    group_known: bool = False  # the fleet's memory decided the group: no group probe
    stopped: int | None = None  # the decision step after which the probes stopped: the stitched phase follows
    settle_steps: int = 0  # the settle block wanted: the job's first baseline block this long (`settle`)
    job_steps: int | None = None  # the job's training steps, when known: the settle block's bound

    @classmethod
    def from_settings(cls, current: settings_module.Settings, clusters: int = 0) -> Timing:
        return cls(
            current.warmup_steps,
            current.baseline_steps,
            current.rebaseline_every,
            current.window_steps,
            current.check_every,
            current.check_first,
            current.slowdown_margin,
            current.probe_steps,
            current.probe_margin,
            clusters,
            current.probe_rounds,
            current.probe_group,
            current.check_clusters,
            current.probe_group_factor,
            current.check_budget,
            current.check_max_gap,
            current.probe_reruns,
            probe_share=current.probe_share,
            probe_min_steps=current.probe_min_steps,
            paired_steps=current.paired_steps,
            settle_steps=current.settle_steps,
        )

    def __post_init__(self) -> None:
        for name in (
            "warmup_steps",
            "check_first",
            "probe_steps",
            "clusters",
            "check_clusters",
            "check_budget",
            "probe_reruns",
            "probe_share",
            "paired_steps",
            "settle_steps",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"Timing.{name}={getattr(self, name)}: expected >= 0")
        for name in (
            "baseline_steps",
            "rebaseline_every",
            "window_steps",
            "check_every",
            "probe_rounds",
            "group_factor",
            "check_max_gap",
            "probe_min_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"Timing.{name}={getattr(self, name)}: expected >= 1")

    @functools.cached_property
    def period(self) -> int:
        """Steps from one baseline window's start to the next (room for stitched steps kept)."""
        return max(self.rebaseline_every, self.baseline_steps + 1)

    @functools.cached_property
    def block(self) -> int:
        """Steps of each baseline block of the stitched phase: the user's graph, between the stitched windows
        it is paired with (`step_windows`); a share of block / period of the stitched phase's steps."""
        return min(self.paired_steps, self.baseline_steps) if self.paired_steps else self.baseline_steps

    @functools.cached_property
    def probed_clusters(self) -> tuple[int, ...]:
        """The clusters with a probe pair of their own, in order (those the fleet decided have none)."""
        return tuple(k for k in range(self.clusters) if k not in self.known)

    @functools.cached_property
    def probing(self) -> bool:
        return self.probe_steps > 0

    @functools.cached_property
    def settle(self) -> int:
        """Steps of the settle block: the job's first baseline block made long enough for plain TF's steps to
        settle (`step_windows.SETTLE_SECONDS`), so that the job measures plain TF's step as a plain process runs it
        (`Windows.calm`); at most `probe_share` of a job of known length, none when the length is unknown."""
        if self.job_steps is None:
            return 0
        return min(self.settle_steps, int(self.probe_share * self.job_steps))

    @functools.cached_property
    def first_block(self) -> int:
        """Steps of the job's first baseline block: `baseline_steps`, or the settle block when longer."""
        return max(self.baseline_steps, self.settle)

    @functools.cached_property
    def probe_start(self) -> int:
        """The first step of the probe phase (right after the first baseline window)."""
        return self.warmup_steps + self.first_block

    @functools.cached_property
    def grouping(self) -> bool:
        """Whether a group probe runs: a group of one cluster would only repeat that cluster's probe."""
        return self.probing and self.probe_group and self.clusters >= 2 and not self.group_known

    @functools.cached_property
    def cluster_start(self) -> int:
        """The first step of the per-cluster probes (after every round of the group's pair, if any)."""
        return self.probe_start + (2 * self.probe_steps * self.group_rounds if self.grouping else 0)

    @functools.cached_property
    def cluster_probe_steps(self) -> int:
        """Steps of the per-cluster probes (every pair's rounds, reruns aside): all of them run the twin."""
        return self.stitched_start - self.cluster_start

    @functools.cached_property
    def exploring_steps(self) -> int:
        """Steps on the twin up to the group's decision (warmup's executor builds, the group's switched-on
        halves): what a job pays before it knows whether stitching wins."""
        return self.warmup_steps + (self.probe_steps * self.group_rounds if self.grouping else 0)

    def probes_left(self, step: int) -> int:
        """Per-cluster probe steps still to run after `step` (reruns aside; none once stopped)."""
        base = self._place(step)[0]
        if self.stopped is not None or base is None:
            return 0 if self.stopped is not None else self.cluster_probe_steps
        return max(self.stitched_start - max(base, self.cluster_start), 0)

    def stop(self, step: int) -> Timing:
        """This schedule with the probes stopped after `step` (a decision step): the stitched phase follows."""
        return replace(self, stopped=step)

    def affordable(self, steps: int, remaining: int | None) -> bool:
        """Whether `steps` of exploration fit in `probe_share` of the `remaining` steps (unknown: they do not)."""
        return remaining is not None and steps <= self.probe_share * remaining

    @functools.cached_property
    def group_rounds(self) -> int:
        return self.group_factor * self.probe_rounds

    @functools.cached_property
    def stitched_start(self) -> int:
        """The first step of the stitched phase (after every round of every cluster's probe pair)."""
        return self.cluster_start + 2 * self.probe_steps * len(self.probed_clusters) * self.probe_rounds

    def _pair(self, step: int) -> tuple[int, int, int, int]:
        """(round, subject, half, index in the half) of a probe-phase step of the schedule without reruns,
        subject GROUP in the group phase: rounds repeat every pair, and odd rounds run the switched-on half
        first, so a steady drift of the step time (a machine warming up or getting busier) adds to both
        halves alike instead of to one."""
        if step < self.cluster_start:
            pair, offset = divmod(step - self.probe_start, 2 * self.probe_steps)
            return pair, GROUP, offset // self.probe_steps, offset % self.probe_steps
        pair, offset = divmod(step - self.cluster_start, 2 * self.probe_steps)
        probed = self.probed_clusters
        return pair // len(probed), probed[pair % len(probed)], offset // self.probe_steps, offset % self.probe_steps

    @functools.cached_property
    def probe_checks(self) -> int:
        """Check steps at the start of each only-k window: one, leaving at least one timed step."""
        return min(self.check_first, 1, max(self.probe_steps - 1, 0))

    def rerun_length(self, subject: int) -> int:
        """The steps of one rerun of `subject`'s pair: all its rounds, back to back."""
        return 2 * self.probe_steps * (self.group_rounds if subject == GROUP else self.probe_rounds)

    def rerun(self, step: int, subject: int) -> Timing:
        """This schedule with `subject`'s pair run again from the step after `step` (its decision step), which
        is replayed after the rerun and decides again."""
        if self.reruns and step < self.reruns[-1][0]:
            raise ValueError(f"rerun at step {step}: the schedule already reruns from step {self.reruns[-1][0]}")
        return replace(self, reruns=(*self.reruns, (step + 1, subject)))

    def reruns_of(self, subject: int) -> int:
        """How many times `subject`'s pair was run again."""
        return sum(1 for _, rerun in self.reruns if rerun == subject)

    def _place(self, step: int) -> tuple[int | None, tuple[int, int, int, int] | None]:
        """(the step of the schedule without reruns that `step` runs, None inside a rerun; `_pair`'s figures of
        `step` when it is a probe step, of a rerun or not). After the probes stopped, the stitched phase."""
        if self.stopped is not None and step > self.stopped:
            return self.stitched_start + step - self.stopped - 1, None
        shift = 0
        for start, subject in self.reruns:
            if step < start:
                break
            length = self.rerun_length(subject)
            if step < start + length:
                pair, offset = divmod(step - start, 2 * self.probe_steps)
                return None, (pair, subject, offset // self.probe_steps, offset % self.probe_steps)
            shift += length + 1  # the rerun's steps, and the decision step replayed after them
        base = step - shift
        return base, self._pair(base) if self.probe_start <= base < self.stitched_start else None

    @functools.cached_property
    def confirm_start(self) -> int | None:
        """The first step of the baseline window that confirms what the probes kept, with room before it for
        the stitched phase's first checks and a bracket of timed stitched steps (`slowdown.Bracket`); None
        without probes (the job's first baseline window comes right before its stitched steps then)."""
        if not self.probing or not self.clusters:
            return None
        return self.stitched_start + self.check_first + 2 * self.baseline_steps

    def phase(self, step: int) -> str:
        """warmup, baseline, probe, reference or stitched, from the step number (and the reruns) alone."""
        base, pair = self._place(step)
        if pair is not None:
            round_, subject, half, _ = pair
            if half != round_ % 2:
                return PROBE
            return BASELINE if subject == GROUP else REFERENCE
        assert base is not None  # only a rerun's steps have no base step, and they are all probe steps
        if base < self.warmup_steps:
            return WARMUP
        if base < self.probe_start:
            return BASELINE
        if self.confirm_start is not None and 0 <= base - self.confirm_start < self.baseline_steps:
            return BASELINE
        offset = base - self.warmup_steps - (self.stitched_start - self.probe_start)
        return BASELINE if offset % self.period < self.block else STITCHED

    def subject(self, step: int) -> int | None:
        """What the probe pair holding `step` measures: GROUP or a cluster index; None outside probing."""
        pair = self._place(step)[1]
        return None if pair is None else pair[1]

    def probed(self, step: int) -> int | None:
        """The cluster whose probe pair (reference, then probe) holds `step`; None outside those."""
        subject = self.subject(step)
        return None if subject == GROUP else subject

    def grouped(self, step: int) -> bool:
        """A step of the group probe phase (either half of a pair)."""
        return self.subject(step) == GROUP

    def decides_group(self, step: int) -> bool:
        """The group is decided at the first step after its last round's pair (its figures are in)."""
        return self.grouping and not self._after_stop(step) and self._place(step)[0] == self.cluster_start

    def _after_stop(self, step: int) -> bool:
        return self.stopped is not None and step > self.stopped

    def decides(self, step: int) -> int | None:
        """The cluster decided at `step`: the first step after its last round's pair (its figures are in)."""
        base = self._place(step)[0]
        if self._after_stop(step):
            return None
        if not self.probing or base is None or base <= self.cluster_start or base > self.stitched_start:
            return None
        done, rest = divmod(base - self.cluster_start, 2 * self.probe_steps)
        probed = self.probed_clusters
        last_round = (done - 1) // len(probed) == self.probe_rounds - 1
        return probed[(done - 1) % len(probed)] if rest == 0 and last_round else None

    def checks(self, step: int) -> bool:
        """A step that compares every cluster switched on with the fp64 reference."""
        phase = self.phase(step)
        if phase == PROBE:
            pair = self._place(step)[1]
            return pair is not None and pair[3] < self.probe_checks
        if phase != STITCHED:
            return False
        return step % self.check_every == 0 or self.first_checks(step)  # the cheap test first: asked every step

    def first_checks(self, step: int) -> bool:
        """One of the stitched phase's first `check_first` steps (for clusters not checked enough yet)."""
        base = self._place(step)[0]
        return base is not None and self.phase(step) == STITCHED and 0 <= base - self.stitched_start < self.check_first

    def rotation(self, turn: int, on: int) -> list[int]:
        """Positions among `on` clusters switched on that the `turn`-th periodic check judges: `check_clusters`
        of them, the next ones each time (all with 0 or when that covers them all). Turns count the checks
        made, not the steps: checks the budget skipped never make the rotation skip a cluster."""
        if self.check_clusters == 0 or self.check_clusters >= on:
            return list(range(on))
        return sorted({(turn * self.check_clusters + j) % on for j in range(self.check_clusters)})


@dataclass
class Probes:
    """The timed steps of each probe pair (the group's under GROUP, each cluster's under its index), per shape
    signature: medians of its probe half and of the half it is compared with (the group's baseline, a
    cluster's reference), and their noise, all of the signature `measured` picks.

    A step counts only under its shape signature (its key; "" for a graph with static shapes). A step whose
    switched-on clusters ran TF's ops because their kernels for it are still to come (seen too rarely yet,
    compiling: `signature_kernels.SignatureKernels.measured` gives None) times no probe: what ran is not
    what will run, and a compile ending between a pair's halves would pass for the probed cluster's gain.
    A step of a cluster's probe half that ran TF's ops for that cluster for good (`plain`: over the bound,
    left, withheld, unbound) times no probe of it either: booked as "stitched", it would charge TF's ops to
    the stitched code (the group's, when every cluster on did: `Controller.timed`); other clusters on TF's
    ops for good run so in both halves alike. Halves are compared
    within one signature, so a batch size fed more often in one half than in the other is no gain.

    The first step on which a switched-on cluster ran its kernel at a signature in this job (`first`: its first
    call there) times no probe either, in whichever half: a first call's one-off cost (the kernel's code paged in,
    buffers of new sizes allocated) is not the kernel's. Most such steps are check steps already (a probe half's
    first step, a kernel bound while the job runs: `signature_kernels`), which time nothing; a kernel shared by
    two signatures, or one whose checks are done, meets a new signature on a timed step. A half has figures only
    with `probe_min_steps` timed steps at the signature (`medians`); with fewer its pair waits for a rerun."""

    timing: Timing
    seconds: dict[tuple[int, str, str], list[float]] = field(default_factory=dict)
    left_out: dict[int, int] = field(default_factory=dict)  # per subject: timed steps that ran TF's ops
    unsettled: dict[int, int] = field(default_factory=dict)  # of those, per subject: kernels still to come
    first: dict[int, int] = field(default_factory=dict)  # per subject: timed steps left out as a first call
    called: set[tuple[int, str]] = field(default_factory=set)  # (cluster, signature) its kernel ran at

    def add(
        self,
        step: int,
        seconds: float,
        timed: bool,
        signature: str | None = "",
        plain: Sequence[int] = (),
        *,
        on: Sequence[int] = (),
    ) -> None:
        """Books a step: `on` the clusters (positions) switched on; a check step (not `timed`) only records the
        calls it made (class docstring)."""
        k = self.timing.subject(step)
        if k is None:
            return  # only probe steps are samples, so first calls are tracked there only
        first = self._first_call(signature, on, plain)
        if not timed:
            return
        if signature is None or k in plain:
            self.left_out[k] = self.left_out.get(k, 0) + 1
            if k not in plain:
                self.unsettled[k] = self.unsettled.get(k, 0) + 1
            return
        if first:
            self.first[k] = self.first.get(k, 0) + 1
            return
        self.seconds.setdefault((k, self.timing.phase(step), signature), []).append(seconds)

    def _first_call(self, signature: str | None, on: Sequence[int], plain: Sequence[int]) -> bool:
        """Whether a cluster on ran its kernel at `signature` for the first time in the job; records the clusters
        that ran it (those in `plain` ran TF's ops; None: kernels still to come, nothing of theirs ran)."""
        if signature is None:
            return False
        new = {(c, signature) for c in on if c not in plain} - self.called
        self.called |= new
        return bool(new)

    def waiting(self, k: int) -> bool:
        """Whether k (or GROUP) has no figures while a rerun of the pair may give them: some of its steps were left
        out because kernels were still to come (compiling, seen too rarely yet) or as a kernel's first call at
        their signature, or a signature has timed steps in both halves but fewer than `probe_min_steps` in one
        (a rerun's steps add to them). Steps that ran TF's ops for good (`plain`: over the bound, withheld...)
        alone never wait: a rerun would run TF's ops there again."""
        if self.medians(k) is not None:
            return False
        return self.unsettled.get(k, 0) > 0 or self.first.get(k, 0) > 0 or self.measured(k) is not None

    def measured(self, k: int) -> str | None:
        """The signature k's (or GROUP's) probe is decided on: the one with the most timed steps in its smaller
        half (ties: the first in key order); None while no signature has timed steps in both halves."""
        paired = {sig: min(map(len, self.halves(k, sig))) for (subject, _, sig) in self.seconds if subject == k}
        best = max(sorted(paired), key=paired.__getitem__, default=None)
        return best if best is not None and paired[best] > 0 else None

    def signatures(self, k: int) -> list[str]:
        """The signatures k (or GROUP) has timed steps under, in either half, in key order."""
        return sorted({sig for (subject, _, sig) in self.seconds if subject == k})

    def halves(self, k: int, signature: str | None) -> tuple[list[float], list[float]]:
        """(probe half, compared half) timed steps of k or GROUP under `signature` (none for None)."""
        if signature is None:
            return [], []
        return self.seconds.get((k, PROBE, signature), []), self.seconds.get((k, compared(k), signature), [])

    def medians(self, k: int) -> tuple[float, float] | None:
        """(probe median, compared half's median) in seconds of cluster k or GROUP under its measured signature;
        None while no signature has `probe_min_steps` timed steps in both halves: a median of one or two steps
        is one step's noise (issue 29: "+71.92 ms/step (72.62 vs 0.69 ms, 1+4 steps ...)" turned a job off)."""
        alone, base = self.halves(k, self.measured(k))
        if min(len(alone), len(base)) < self.timing.probe_min_steps:
            return None
        return statistics.median(alone), statistics.median(base)

    def noise(self, k: int) -> float:
        """The standard error of (probe median - compared median) of k or GROUP (`median_noise`)."""
        return median_noise(*self.halves(k, self.measured(k)))


def compared(subject: int) -> str:
    """The phase a probe half is compared with: the group's plain baseline, a cluster's reference."""
    return BASELINE if subject == GROUP else REFERENCE
