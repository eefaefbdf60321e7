"""Whether a job's setup can pay back: the gain stitching could bring over its planned steps against what setup costs.

Input: the job's planned steps, its plain step time when known (STITCHFLEET_STEP_MS: the fleet's or the user's
figure), the backend, the `Timing` of its exploration and, when the decision depends on it, what the kernel cache
holds of the job's last setup and what its last run there measured (`setup_record.CacheState`). Output: a `Payback`
with the estimated cost, the gain, the decision, the case (warm, partly warm, cold) and its sentence, which the
job's telemetry records (a `setup` event); for a job of unknown length, the `Deferral`: how long it trains as
written before its setup starts.
Rules: docs/plugin/setup.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from stitchfleet.compiler import targets
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.setup.setup_record import CacheState, Measured


@dataclass(frozen=True)
class SetupSeconds:
    """What setup adds to a job beyond its plain session (creation and first steps), by what the kernel cache holds:
    `warm` with every kernel of the job and the native op there (the session's creation under the plugin, the
    twin's first executor builds), `kernels` more when none of its kernels is there (C compiles, translation
    checks; that share of it when some are), `op` more when the native op is to be built (a C++ compile against
    TF's headers beside the kernels': the longest path of a cold setup)."""

    warm: float
    kernels: float
    op: float

    @property
    def cold(self) -> float:
        return self.warm + self.kernels + self.op

    def sized(self, ops: int) -> SetupSeconds:
        """The figures for a graph of `ops` ops (0: unknown, the demo's): the parts that grow with the graph (the
        session's and the twin's builds, the kernels' compiles and checks) by `size_factor`; the op's build not."""
        factor = size_factor(ops)
        return SetupSeconds(self.warm * factor, self.kernels * factor, self.op)

    def fixed(self, state: CacheState) -> float:
        """The setup's cost with what the cache holds; a warm run costs what the job's last run here paid that a
        warm run pays again (`Measured.per_run`), smaller than the fixed figure too (the demo's on session 18's
        machine: the MLP's 0.6-0.9 s against 1.5 s, session 49), else the figure for the graph's size."""
        measured = state.measured.per_run if state.measured is not None else 0.0
        warm = measured if measured > 0 else self.warm
        return warm + self.kernels * state.missing + (0.0 if state.op else self.op)


# Measured on the demo model (scripts/setup_phases.py, 2-core machine, benchmarks/README.md "Session 18: setup
# cost"): creation plus the first 10 steps beyond plain TF's, medians: warm 1.4 s, the op in the cache but no kernel
# 3.4 s, nothing in the cache 7.6 s. Upper figures of a quiet machine (under load every phase stretches: a
# demanding user's job on a loaded node repays less, so the figures round up).
SETUP_SECONDS = {"cpu": SetupSeconds(warm=1.5, kernels=2.0, op=4.2)}  # per device kind (`Profile.runs_on`)
# The demo model's graph at `begin` (the user's, as the hook sees it: 1059 ops), where SETUP_SECONDS were measured,
# and how a larger graph's setup grows with its op count. Cold setups with the op prebuilt, booked by the plugin in
# one sitting (benchmarks/README.md, session 35): the transformer's (1586 ops) 1.46-1.47x the demo's, the corpus
# BERT's (2782 ops: 32 clusters) 3.6-4.1x; ops ** 0.95 and ** 1.40 each, 1.33 by least squares of the logs over
# both. 1.3 weighs the transformer 1.69x (over its measured) and BERT 3.51x (just under its 3.6-4.1x).
DEMO_OPS = 1059
SIZE_EXPONENT = 1.3


def size_factor(ops: int) -> float:
    """How many times the demo's graph-bound setup a graph of `ops` ops pays: (ops / DEMO_OPS) ** SIZE_EXPONENT,
    never below 1 (a smaller graph pays the session's and a kernel's fixed costs all the same); 1 when unknown."""
    return max(1.0, ops / DEMO_OPS) ** SIZE_EXPONENT if ops > 0 else 1.0


# GPU backends: not measured here; the CPU's cold figure stands in, whatever their cache holds (stated)
SETUP_SECONDS_OTHER = SetupSeconds(warm=SETUP_SECONDS["cpu"].cold, kernels=0.0, op=0.0)
# The best steady gain a stitched step has shown against plain TF in a job on the CPU: the demo's stitched steps at
# 0.76-0.82x of plain TF's steps of the same numbers, the hook's work included (`make demo`'s train, four runs,
# session 48, 2.5-4.1 ms steps); the MLP's 0.833x and the Transformer's 0.830x steady (session 45's A/B). It was 10%
# (the demo's 0.90x of session 18), under what jobs have since shown: on a faster node it turned the demo away ("a
# gain of at most 3.0 s against 3.5 s") where the demo set up saved 2.1-3.0 s net. An upper figure: a job's stitched
# phase also runs baseline blocks (5%) and check steps at plain speed; what its last run here measured replaces it.
BEST_GAIN = 0.20
# What a probe's mixed configuration costs over plain TF's step: +11% to +27% measured per cluster alone (issue 29).
PROBE_LOSS = 0.25
# Runs that skip their setup on what the job's last run on the node measured before one explores again: one noisy or
# loaded run's figure does not shut a graph out for good; the exploring run (+8-12% of a job: issue 29) costs ~1% a run.
RETRY_AFTER = 10


@dataclass(frozen=True)
class Payback:
    """The estimate for one job: seconds setup and exploration cost, seconds the best gain returns, the verdict."""

    steps: int | None  # planned steps (None: unknown)
    step_seconds: float | None  # plain step time (None: unknown)
    cost: float  # seconds: fixed setup plus the exploration's expected loss
    gain: float  # seconds: BEST_GAIN (or the measured share) of the steps after exploration, at the plain step time
    affordable: bool
    why: str
    case: str = "cold"  # the setup figure used: warm, partly warm, cold (what the cache holds), or not looked up
    state: CacheState | None = None  # what the cache held, when it was read (its measured figures, their skips)
    weighed: Measured | None = None  # what the job's last run here measured, when the decision weighed it


def setup_seconds(backend: str) -> SetupSeconds:
    """What setup adds to a job on `backend` (a target, or `auto`): SETUP_SECONDS of the device kind it runs on;
    SETUP_SECONDS_OTHER for a name no target has (the hook's setup then says what is wrong)."""
    try:
        runs_on = targets.profile(targets.automatic("cpu") if backend == "auto" else backend).runs_on
    except (ImportError, KeyError, ValueError):
        return SETUP_SECONDS_OTHER
    return SETUP_SECONDS.get(runs_on, SETUP_SECONDS_OTHER)


def fixed_seconds(backend: str) -> float:
    """Setup's cold figure on `backend`: what a job whose kernels the cache does not hold pays beyond plain TF."""
    return setup_seconds(backend).cold


@dataclass(frozen=True)
class Deferral:
    """A job of unknown length: it trains as written for `seconds` (setup's `fixed` cost over `share`), then sets up.

    Why: a job that ends before then paid nothing; one that ends right after its setup paid at most `share` of its
    time for it (the setup started only once `fixed` <= `share` x the time trained); a long job gives up at most
    BEST_GAIN of `seconds`, once."""

    seconds: float
    fixed: float
    share: float

    def waiting(self) -> str:
        return (
            f"the job's length is unknown: it trains as written for {self.seconds:.0f} s, then sets up (setup's"
            f" fixed cost of about {self.fixed:g} s is then at most SETUP_SHARE {self.share:.0%} of its time)"
        )

    def ended(self, trained: float, steps: int) -> str:
        return (
            f"the job's length was unknown and it ended after {steps} training steps in {trained:.1f} s, before the"
            f" {self.seconds:.0f} s after which it would have set up: no compile, no probe, it ran as written"
        )


def deferral(backend: str, share: float) -> Deferral | None:
    """How long a job of unknown length on `backend` trains before it sets up; None when SETUP_SHARE is 0 (at once)."""
    if share <= 0:
        return None
    fixed = fixed_seconds(backend)
    return Deferral(fixed / share, fixed, share)


def estimate(
    steps: int | None,
    step_seconds: float | None,
    backend: str,
    timing: Timing,
    cache: Callable[[], CacheState] | None = None,
    *,
    ops: int = 0,
) -> Payback:
    """The job's setup decision. Unknown length or step time: set up (the probes then bound themselves by the
    steps left); known both: set up only when the best gain over the steps left after exploring exceeds the cost.
    The fixed cost is the cold figure unless `cache` (what the kernel cache holds of this job's last setup) says
    otherwise, and the gain BEST_GAIN unless the job's last run there measured one (on the steps that run stitched);
    the cache is looked up unless the best gain does not even repay the exploring. A step time no one states is the
    one the job's last run there measured (`Measured.plain_step`), when the cache holds it. `ops`: the user's graph's
    op count, which sizes the fixed figures (`SetupSeconds.sized`)."""
    seconds = setup_seconds(backend).sized(ops)
    read: CacheState | None = None
    step_source = ""
    if steps is not None and step_seconds is None and cache is not None:
        # Else every run of a job whose last run found stitching no faster set up again (the corpus BERT: 3.8 s
        # before its first step and 5 s of probes a run, 1.13x its plain wall), the operator's figure being unset.
        read = cache()
        if read.measured is not None and read.measured.plain_step > 0:
            step_seconds, step_source = read.measured.plain_step, " (the step its last run here measured)"
    if steps is None or step_seconds is None:
        missing = "length" if steps is None else "step time"
        why = f"the job's {missing} is unknown: setup runs, and the probes stop when the steps left cannot repay them"
        return Payback(steps, step_seconds, seconds.cold, float("nan"), True, why, "unknown", read)
    exploring = min(timing.exploring_steps, steps)
    probes = exploring * step_seconds * PROBE_LOSS
    share, source = BEST_GAIN, "the best a stitched step has shown"
    # plain TF's seconds over the steps after exploring that can run stitched: the settle block's steps beyond a
    # first baseline block of the usual length run the user's graph and gain nothing (`Timing.settle`)
    settling = max(replace(timing, job_steps=steps).first_block - timing.baseline_steps, 0)
    stepped = max(steps - exploring - settling, 0) * step_seconds
    # Read whenever the gain repays more than the exploring (or already read for the step time): what the job's last
    # run here measured (its steady gain, a larger graph's setup, a loss) weighs instead, and its warm setup can cost
    # less than the fixed figure (`SetupSeconds.fixed`: the MLP's 0.9 s against 1.5 s). Reading costs 4-8 ms.
    state = read if read is not None or cache is None or stepped * share <= probes else cache()
    measured, on = None, ""
    if state is None:
        fixed, case = seconds.cold, "cold, not looked up"
        unread = "the gain does not repay the exploring, the cache unread"
        said = "cold: the cache unread" if cache is None else f"cold: {unread}"
    else:
        measured = state.measured
        said = f"{state.case}: {state.why}" + ("" if state.op else ", and the native op is to be built")
        if measured is not None and measured.skips >= RETRY_AFTER:
            said += f"; {measured.skips} runs skipped their setup on what its last run here measured: this one explores"
            measured = None
        fixed, case = seconds.fixed(state), state.case  # a retry too: a warm run pays what its last run paid again
        if measured is not None:  # above BEST_GAIN too, on the steps that run stitched (docs/plugin/setup.md)
            expected, stitched = measured.expected(timing.probe_margin), 1 - timing.block / timing.period
            share, source = (expected * stitched if expected > 0 else expected), measured.said()
            on = f", {expected:.1%} on the {stitched:.0%} of them that run stitched" if expected > 0 else ""
    gain, cost = stepped * share, fixed + probes
    sized = f" for a graph of {ops} ops" if size_factor(ops) > 1 else ""
    refused = measured is not None and gain <= cost  # on what the job's last run here measured: that reason first
    figures = (
        f"{steps} steps of {step_seconds * 1e3:.2f} ms{step_source}: a gain of at most {gain:.1f} s ({share:.1%} of"
        f" the steps after {exploring} exploring{on}: {'as measured' if refused else source}) against a setup cost of"
        f" about {cost:.1f} s ({fixed:.1f} s fixed on {backend}{sized}, {said}; plus {exploring} exploring steps at"
        f" +{PROBE_LOSS:.0%})"
    )
    if gain > cost:
        return Payback(steps, step_seconds, cost, gain, True, f"setup can pay back: {figures}", case, state, measured)
    first = f"{source}; " if refused else ""
    why = f"setup cannot pay back: {first}{figures}: no compile, no probe, the job runs as written"
    return Payback(steps, step_seconds, cost, gain, False, why, case, state, measured)
