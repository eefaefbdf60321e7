"""Whether a job's setup can pay back: the gain stitching could bring over its planned steps against what setup costs.

Input: the job's planned steps, its plain step time when known (STITCHFLEET_STEP_MS: the fleet's or the user's
figure), the backend, the `Timing` of its exploration. Output: a `Payback` with the estimated cost, the best gain,
the decision and its sentence, which the job's telemetry records (a `setup` event). Rules: docs/plugin/setup.md.
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


def estimate(steps: int | None, step_seconds: float | None, backend: str, timing: Timing) -> Payback:
    """The job's setup decision. Unknown length or step time: set up (the probes then bound themselves by the
    steps left); known both: set up only when the best gain over the steps left after exploring exceeds the cost."""
    fixed = FIXED_SECONDS.get(targets.profile(backend).runs_on, FIXED_SECONDS_OTHER)
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
