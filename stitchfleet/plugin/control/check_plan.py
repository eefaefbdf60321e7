"""Which clusters a step judges against the fp64 reference, and what the checks cost: the guard's schedule.

Input: the job's `Timing`, per step its mode and the clusters switched on; after a check step, what it took beyond a
usual step (its run's extra and the judging, the plugin's own work on it). Output: the clusters a step judges
(`judged`), the checks per cluster so far. TF-free; the rules: docs/plugin/controller.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchfleet.plugin.control.schedule import Timing


@dataclass
class CheckPlan:
    """The checks made so far: per cluster, their cost, the last check's step and the periodic rotation's turn."""

    counts: list[int]
    seconds: float = 0.0  # what check steps took beyond a usual step, judging included
    last: int = 0  # the last step that judged a cluster: checks wait for the budget at most check_max_gap
    turn: int = 0  # periodic checks made so far (their rotation over the clusters)

    def judged(self, timing: Timing, step: int, on: list[int], stitched: bool, job_seconds: float) -> list[int]:
        """The clusters (positions, among `on`) whose stitched outputs are compared with the reference at `step`.

        A probe window's check judges what it switched on (the probed cluster, or every cluster of the
        group). The stitched phase's first steps judge only clusters checked fewer than `check_first`
        times so far in this job (probe checks count: the code and its numerics did not change). A
        periodic check judges `check_clusters` of the clusters on, in rotation: each check costs 1-25 ms
        per cluster of numpy on the host, which a small step cannot pay for every cluster every time;
        and it is skipped while the checks so far took more than `check_budget` of the job's time
        (on a 3 ms CPU step a check every 100 steps is ~5% of the job; on a 100 ms GPU step, 0.2%), but
        never for more than `check_max_gap` steps since the last check: the budget delays checks, it cannot
        stop them, so a fault that starts late is judged within a bounded number of steps (see Timing).
        """
        if not timing.checks(step):
            return []
        if not stitched:  # a probe window: what it switched on, until checked enough
            return [k for k in on if self.counts[k] < timing.check_first]
        if timing.first_checks(step):
            fresh = [k for k in on if self.counts[k] < timing.check_first]
            if fresh or step % timing.check_every:
                return fresh
        over_budget = self.seconds > timing.check_budget * job_seconds
        if over_budget and step - self.last < timing.check_max_gap:
            return []
        return [on[j] for j in timing.rotation(self.turn, len(on))]

    def count(self, judged: list[int], step: int | None, periodic: bool) -> None:
        """Books the clusters a step judged; `periodic`: a check of the stitched phase past its first checks."""
        for k in judged:
            self.counts[k] += 1
        if judged and step is not None:
            self.last = step
            if periodic:
                self.turn += 1  # a periodic check was made: the rotation moves on

    def book(self, seconds: float, usual: float, own: float) -> None:
        """A check step's cost: its run beyond a usual step, and its judging (numpy against the fp64 reference,
        6-70 ms on the demo's 4.5 ms steps: the plugin's own work on the step, outside its run). The budget
        counted the run alone, so the demo checked every 100 steps at 5-8% of its time against a 1% budget."""
        self.seconds += max(seconds - usual, 0.0) + own
