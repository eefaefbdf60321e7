"""How far a job's probes go: the fleet's known decisions, and the probes cut to what its steps can repay.

Input: the controller's clusters, `Ledger`, ranks, `ProbeDecisions` and `JobCourse`; the job's length when known.
Output: decisions taken without a probe (before the first step), per-cluster probes stopped or skipped when the
job's remaining steps could not repay them (stitching off then). TF-free; the rules: docs/plugin/controller.md.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.job_course import JobCourse
from stitchfleet.plugin.control.probe_decisions import ProbeDecisions
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.fleet.verdict_keys import group_key
from stitchfleet.telemetry.kinds import ProbeOutcome

log = logging.getLogger("stitchfleet.plugin")


class ProbeCourse:
    """The fleet's memory and the job's length applied to the probe schedule (see the module docstring)."""

    def __init__(
        self,
        clusters: list[Cluster],
        ledger: Ledger,
        size: int,
        decisions: ProbeDecisions,
        course: JobCourse,
        *,
        job_steps: int | None = None,
    ) -> None:
        self.clusters, self.ledger, self.size, self.decisions, self.course = clusters, ledger, size, decisions, course
        self.job_steps = job_steps  # the job's training steps from the controller's step 0, when known
        self.recalled = False  # the fleet's known decisions were applied (`recall`, before the first step)

    @property
    def timing(self) -> Timing:
        return self.decisions.timing

    @property
    def group_proven(self) -> bool | None:
        return self.decisions.group_proven

    def recall(self, step: int) -> None:
        """Before the job's first step: the decisions the fleet's memory holds for these clusters (faster or
        slower, per fingerprint, device profile and shapes; `Ledger.recollection`) and for their group are
        taken without a probe, each with an event saying so and why. One rank only: Horovod ranks may recall
        different memories (one read the operator, another its cache) and must share the schedule."""
        self.recalled = True
        memory = self.ledger.recollection
        if memory is None or self.size != 1 or not self.timing.probing or not self.clusters:
            return
        verdicts = {v.key: v for v in (*memory.slower, *memory.faster)}
        known: dict[int, tuple[str, str]] = {}
        for k, c in enumerate(self.clusters):
            found = verdicts.get((c.fingerprint, c.profile, c.shapes))
            if found is not None and c.enabled:
                known[k] = (str(found.outcome), found.reason)
        group = verdicts.get(self.group_key()) if self.timing.grouping else None
        if not known and group is None:
            return
        self.decisions.retime(replace(self.timing, known=frozenset(known), group_known=group is not None))
        for k, (outcome, reason) in sorted(known.items()):
            self.decisions.known(step, self.clusters[k], outcome == ProbeOutcome.FASTER, reason)
        if group is not None:
            self.decisions.known_group(step, group.outcome == ProbeOutcome.FASTER, group.reason)
            if not self.group_proven:
                self.after_group_loss(step)
        if self.course.stitching_off is None and not self.timing.probed_clusters:
            self.course.settle(step)

    def group_key(self) -> tuple[str, str, str]:
        """The key of this job's group (every cluster on) in the fleet's memory (`verdict_keys.group_key`)."""
        return group_key([(c.fingerprint, c.profile, c.shapes) for c in self.clusters])

    def remaining(self, step: int) -> int | None:
        """The job's steps after `step`, when its length is known."""
        return None if self.job_steps is None else max(self.job_steps - step - 1, 0)

    def bound(self, step: int) -> None:
        """After a decision: the per-cluster probes go on only while what is left of them fits in `probe_share`
        of the job's remaining steps (each runs a mixed configuration on the twin, whose clusters off pay for
        their fallback functions: a cost the steps left could not repay). Else they stop now: every cluster
        not decided yet is kept with a proven group, or left to TF; the stitched phase follows."""
        remaining, left = self.remaining(step), self.timing.probes_left(step)
        if left == 0 or remaining is None or self.timing.affordable(left, remaining):
            return
        why = (
            f"per-cluster probes stopped: {left} steps of them left, {remaining} steps left in the job"
            f" (PROBE_SHARE {self.timing.probe_share:.0%})"
        )
        self.decisions.retime(self.timing.stop(step))
        for c in self.clusters:
            if c.enabled and c.kept is None:
                c.probe = why
                if self.group_proven:
                    self.decisions.keep(step, c, "kept with the group", finding=False)
                else:
                    self.decisions.leave(step, c, "not probed", why)
        log.info("stitchfleet: %s at step %d", why, step)
        self.ledger.event("probe", step, None, "per-cluster probes stopped", detail=why)
        self.course.settle(step)

    def after_group_loss(self, step: int) -> None:
        """The group was not faster than plain TF: the per-cluster probes go on only when they fit in
        `probe_share` of the job's remaining steps (known: `job_steps`); else stitching is off for the job now
        and every later step runs the user's graph. Each of those probes runs a mixed configuration on the
        twin, where clusters off pay for their fallback functions: on a losing job they are mostly regret."""
        remaining = self.remaining(step)
        cost = self.timing.probes_left(step)
        if self.timing.affordable(cost, remaining):
            log.info("stitchfleet: group not faster; per-cluster probes: %d of %s steps left", cost, remaining)
            return
        left = "the job's length is unknown" if remaining is None else f"{remaining} steps are left"
        why = (
            f"group not faster and per-cluster probes skipped: they would take {cost} steps on the twin,"
            f" {left} (PROBE_SHARE {self.timing.probe_share:.0%}); the job runs its own graph"
        )
        self.course.switch_off(step, "per-cluster probes skipped", why)
