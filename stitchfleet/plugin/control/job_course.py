"""Whether stitching goes on for a job: its reverts (a cluster's, the job's), stitching off, and its outcome.

Input: the controller's clusters and `Ledger`; the controller's calls when a decision reverts or settles, and the
slowdown guard's pooled verdicts (`slowed`). Output: `done` (latched: nothing turns a job or a cluster back on), the
revert and outcome events and verdicts in the ledger. TF-free; the rules: docs/plugin/controller.md, control.md.
"""

from __future__ import annotations

import logging

import numpy as np

from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.signature_decisions import NOISE_FACTOR
from stitchfleet.plugin.control.slowdown import Figures
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.guard.numeric import Finding

log = logging.getLogger("stitchfleet.plugin")


class JobCourse:
    """The job's and its clusters' state of stitching (see the module docstring)."""

    def __init__(self, clusters: list[Cluster], ledger: Ledger) -> None:
        self.clusters, self.ledger = clusters, ledger
        self.job_reverted: str | None = None
        self.stitching_off: str | None = None
        self.slowdown: Figures | None = None  # the slowdown revert's figures (`slowed`)
        self.suspect: tuple[int, Figures] | None = None  # the step and figures of a verdict awaiting confirmation
        self._over = False  # `done`, latched

    @property
    def done(self) -> bool:
        """No cluster can run stitched again in this job (the job reverted, no cluster kept, or every one
        reverted): nothing is left to decide, so the hook stops adding anything to the job's steps. Every
        rank sees it at the same step, since it follows from the summed decisions only. Latched once true:
        nothing turns a job or a cluster back on, and the hook asks it every step."""
        if not self._over:
            over = self.job_reverted is not None or self.stitching_off is not None
            if not over:  # a loop, not `any` of a generator: asked a few times every step, it stops at the first
                for c in self.clusters:
                    if c.enabled:
                        break
                else:
                    over = True
            self._over = over
        return self._over

    @property
    def stitching(self) -> bool:
        """Whether any cluster can still run stitched: with none on, a slow step is not the plugin's doing
        (regression: a job whose probes kept nothing was reverted "for slowdown" on one noisy step)."""
        return self.stitching_off is None and any(c.enabled for c in self.clusters)

    def revert_cluster(self, step: int, c: Cluster, why: Finding | str) -> None:
        c.enabled, c.reverted_at = False, step
        reason = "mismatch" if isinstance(why, Finding) else why
        figures = finding_figures(why) if isinstance(why, Finding) else {}
        detail = why.reason if isinstance(why, Finding) else why
        c.reason = f"{reason}: {detail}" if isinstance(why, Finding) else why  # a text is said once, not twice
        log.warning("stitchfleet: cluster %d reverted at step %d: %s", c.index, step, c.reason)
        evidenced = why.detail if isinstance(why, Finding) else detail  # with the evidence a recheck judges
        self.ledger.event("revert", step, c.fingerprint, reason, detail=evidenced, **figures)
        self.ledger.verdict(c.fingerprint, "reverted", c.reason, c.op_count)

    def revert_job(self, step: int, reason: str, detail: str) -> None:
        if self.job_reverted is not None:
            return
        self.job_reverted = f"{reason}: {detail}"
        log.warning("stitchfleet: stitching reverted for the job at step %d: %s", step, self.job_reverted)
        self.ledger.event("revert", step, None, reason, detail=detail)

    def slowed(self, step: int, figures: Figures, margin: float) -> None:
        """A pooled slowdown verdict (`slowdown.Bracket`, summed over ranks: alike on every rank). Beyond the margin and
        NOISE_FACTOR standard errors it makes the job suspect; the next one reverts the job if beyond them too, else
        clears the suspicion. The two verdicts' mean (seconds) is kept for the next run (`setup.last_run`)."""
        stitched, base, noise = figures
        earlier, self.suspect = self.suspect, None
        if stitched - base <= max(base * margin, NOISE_FACTOR * noise):
            return
        if earlier is None:
            self.suspect = (step, figures)
            log.info("stitchfleet: step %d: stitched steps slower, to be confirmed: %s", step, _said(figures))
            return
        at, first = earlier
        mean = ((first[0] + stitched) / 2, (first[1] + base) / 2, (first[2] ** 2 + noise**2) ** 0.5 / 2)  # disjoint
        self.slowdown = self.slowdown or mean
        confirmed = f"confirms step {at}'s {first[0]:.6f} vs {first[1]:.6f} s (noise {first[2]:.6f} s)"
        self.revert_job(step, "slowdown", f"{_said(figures)}; {confirmed}")

    def switch_off(self, step: int, reason: str, why: str) -> None:
        """Stitching off for the job (not an error): every later step runs the user's graph."""
        self.stitching_off = why
        log.info("stitchfleet: stitching off for the job at step %d: %s", step, why)
        self.ledger.event("probe", step, None, reason, detail=why)

    def settle(self, step: int) -> None:
        """After the last probe: with no cluster kept, stitching is off for the job (not an error)."""
        if any(c.enabled and c.kept for c in self.clusters):
            return
        self.switch_off(step, "no cluster kept", "no cluster kept: none passed its probe; the job runs TF's own ops")

    def finish(self, probing: bool, group_proven: bool | None) -> None:
        """The job's outcome in the ledger (its windows are closed before)."""
        reverted = [c for c in self.clusters if c.reverted_at is not None]
        if self.job_reverted is not None:
            self.ledger.finished("reverted", self.job_reverted)
            return
        notes = [self.stitching_off] if self.stitching_off else []
        if probing:
            notes.append(f"probe kept {sum(bool(c.kept) for c in self.clusters)}/{len(self.clusters)} clusters")
        if group_proven is not None:
            notes.append("group proven" if group_proven else "group not faster")
        notes += [f"cluster {c.index} {c.reason}" for c in reverted]
        self.ledger.finished("finished", "; ".join(notes))


def _said(figures: Figures) -> str:
    stitched, baseline, noise = figures
    return f"stitched median {stitched:.6f} s vs baseline {baseline:.6f} s per step (noise {noise:.6f} s)"


def finding_figures(finding: Finding) -> dict[str, float | None]:
    """A mismatch's figures for its ledger event."""
    error = finding.compiled_error
    return {"max_abs_error": error if np.isfinite(error) else None, "error_ratio": finding.ratio}
