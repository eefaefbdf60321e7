"""Whether a job's setup can pay back: the gain stitching could bring over its planned steps against what setup costs.

Input: the job's planned steps, its plain step time when known (STITCHFLEET_STEP_MS: the fleet's or the user's
figure), the backend, the `Timing` of its exploration. Output: a `Payback` with the estimated cost, the best gain,
the decision and its sentence, which the job's telemetry records (a `setup` event); for a job of unknown length, the
`Deferral`: how long it trains as written before its setup starts. Rules: docs/plugin/setup.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchfleet.compiler import targets
from stitchfleet.plugin.control.schedule import Timing

# Fixed seconds setup adds to a job on the CPU beyond its plain session, measured on the demo model (2-core machine,
# issue 29, benchmarks/README.md "demo"): session creation 6.4 s under the plugin against 1.3 s plain (selection,
# the translation check, the twin, the native op load) and the first executor builds of the twin 5.4 s. Kernels
# from a warm cache make the first figure smaller, never the second: the estimate keeps both (an upper figure
# keeps a short job out of harm's way; a long job repays either).
FIXED_SECONDS = {"cpu": 10.5}  # per device kind the backend runs on (`Profile.runs_on`)
FIXED_SECONDS_OTHER = 10.5  # GPU backends: not measured here; the CPU figure stands in (stated in the sentence)
# The best steady gain a stitched step has shown against plain TF in a job on the CPU: the twin with every cluster
# on at 0.88x plain's CPU time (benchmarks/README.md, perf session 11); through the hook 0.95-0.98x.
BEST_GAIN = 0.12
# What a probe's mixed configuration costs over plain TF's step: +11% to +27% measured per cluster alone (issue 29).
PROBE_LOSS = 0.25


@dataclass(frozen=True)
class Payback:
    """The estimate for one job: seconds setup and exploration cost, seconds the best gain returns, the verdict."""

    steps: int | None  # planned steps (None: unknown)
    step_seconds: float | None  # plain step time (None: unknown)
    cost: float  # seconds: fixed setup plus the exploration's expected loss
    gain: float  # seconds: BEST_GAIN of the steps after exploration, at the plain step time
    affordable: bool
    why: str


def fixed_seconds(backend: str) -> float:
    """What setup adds to a job on `backend` (a target, or `auto`) beyond its plain session: FIXED_SECONDS of the
    device kind it runs on; FIXED_SECONDS_OTHER for a name no target has (the hook's setup then says what is wrong)."""
    try:
        runs_on = targets.profile(targets.automatic("cpu") if backend == "auto" else backend).runs_on
    except (ImportError, KeyError, ValueError):
        return FIXED_SECONDS_OTHER
    return FIXED_SECONDS.get(runs_on, FIXED_SECONDS_OTHER)


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


def estimate(steps: int | None, step_seconds: float | None, backend: str, timing: Timing) -> Payback:
    """The job's setup decision. Unknown length or step time: set up (the probes then bound themselves by the
    steps left); known both: set up only when the best gain over the steps left after exploring exceeds the cost."""
    fixed = fixed_seconds(backend)
    if steps is None or step_seconds is None:
        missing = "length" if steps is None else "step time"
        why = f"the job's {missing} is unknown: setup runs, and the probes stop when the steps left cannot repay them"
        return Payback(steps, step_seconds, fixed, float("nan"), True, why)
    exploring = min(timing.exploring_steps, steps)
    cost = fixed + exploring * step_seconds * PROBE_LOSS
    gain = max(steps - exploring, 0) * step_seconds * BEST_GAIN
    figures = (
        f"{steps} steps of {step_seconds * 1e3:.2f} ms: a gain of at most {gain:.1f} s ({BEST_GAIN:.0%} of the steps"
        f" after {exploring} exploring) against a setup cost of about {cost:.1f} s ({fixed:g} s fixed on {backend}"
        f" plus {exploring} exploring steps at +{PROBE_LOSS:.0%})"
    )
    if gain > cost:
        return Payback(steps, step_seconds, cost, gain, True, f"setup can pay back: {figures}")
    why = f"setup cannot pay back: {figures}: no compile, no probe, the job runs as written"
    return Payback(steps, step_seconds, cost, gain, False, why)
