"""How a probe pair's figures become a decision: the group proven or not, each cluster kept or left to TF.

Input: the summed probe figures of a decision step (ready ranks, the switched-on half's median, the
compared half's median, noise; each a sum over ranks), the clusters, the timing, this rank's probe
samples and the `Ledger`. Output: the group's decision (`group_proven`, `group_probe`), each probed
cluster's (`Cluster.kept`, `reason`, `probe`; events `probe` / `cluster_enabled`, fleet verdicts and the
probe findings), and `stitching_off` when the last probe kept nothing. The rules are in the
controller's module docstring; this is the part of `Controller` that applies them (a base class, so
the controller stays one object with one state).

The figures compared are the ranks' means of their own medians, the same on every rank.

Per shape signature (a graph with unknown dimensions: `signature_kernels`): a rank's medians are those of
the signature it timed most in both halves (`schedule.Probes.measured`); steps whose kernels were still to
come (compiling, seen too rarely), and a cluster's probe steps where it ran TF's ops for good (over the
bound, left, withheld by the fleet, unbound by the guard), are left out and said in the figures ("N on
TF's ops left out"). The fleet finding (`Ledger.probed`)
is keyed by the shapes of the signature this rank measured (`measured`), not begin's (a guess, `GUESS`,
in a job's first process): a later process of the job builds begin's kernels for the signature its book
recorded, and `candidates` reads the fleet's verdicts for those shapes. The cluster's decision is taken
on those figures, from the summed vector, so Horovod ranks take the same.

Then per signature (`signature_verdicts`): a kept cluster loses its kernel for a signature where it was
slower than TF's ops; a cluster its probe would leave to TF stays on for the signatures where it was
faster, and only for those.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchfleet.plugin.ledger import Ledger
from stitchfleet.plugin.schedule import GROUP, Probes, Timing
from stitchfleet.plugin.signature_verdicts import NOISE_FACTOR, SignatureLookup, SignatureVerdicts

if TYPE_CHECKING:
    from stitchfleet.plugin.controller import Cluster

log = logging.getLogger("stitchfleet.plugin")
__all__ = ["NOISE_FACTOR", "ProbeVerdicts"]


class ProbeVerdicts(SignatureVerdicts):
    """The probe decisions of `Controller`, which sets these attributes up."""

    clusters: list[Cluster]
    ledger: Ledger
    size: int
    timing: Timing
    probes: Probes
    group_proven: bool | None
    group_probe: str
    stitching_off: str | None
    kernels: SignatureLookup | None

    rerun_futile: bool

    def _rerun(self, step: int, subject: int, ready: float, waiting: float) -> bool:
        """Runs `subject`'s pair (GROUP or a cluster) again when some rank had no figures for it only because its
        kernels for the shapes fed were still to come (compiling, seen too rarely yet: `waiting` ranks); says
        whether it does. Not for a rank that ran TF's ops for good there (over the bound, withheld, unbound):
        a rerun would give it no figures either. At most `probe_reruns` times per subject, and no more for any
        subject once one ran out of them without figures (whatever kept that rank waiting did not pass:
        rerunning every pair would only lengthen the probes). From the summed figures only, so every rank
        inserts the same steps at the same step."""
        if ready >= self.size or waiting < 1 or self.rerun_futile:
            return False
        done = self.timing.reruns_of(subject)
        if done >= self.timing.probe_reruns:
            self.rerun_futile = done > 0
            return False
        self.timing = self.timing.rerun(step, subject)
        self.probes.timing = self.timing
        name = "group" if subject == GROUP else f"cluster {self.clusters[subject].index}"
        detail = (
            f"{name}: {ready:.0f} of {self.size} ranks had timed both halves, {waiting:.0f} waiting for kernels;"
            " its pair runs again"
            f" ({done + 1} of at most {self.timing.probe_reruns})"
        )
        log.info("stitchfleet: probe rerun at step %d: %s", step, detail)
        fingerprint = None if subject == GROUP else self.clusters[subject].fingerprint
        self.ledger.event("probe", step, fingerprint, "probe rerun", detail=detail)
        return True

    def _group_decision(self, step: int, figures: np.ndarray[Any, np.dtype[np.float64]]) -> bool:
        """Proves the group (every cluster on) or not, from the summed group figures; False when its pair
        runs again instead (`_rerun`)."""
        ready, on, base, noise, waiting = (float(x) for x in figures)
        if self._rerun(step, GROUP, ready, waiting):
            return False
        if ready < self.size:
            self.group_proven = False
            self.group_probe = f"no group figures: {ready:.0f} of {self.size} ranks had timed both windows"
        else:
            on, base, noise = on / self.size, base / self.size, noise / self.size
            self.group_probe = self._describe(GROUP, on, base, noise)
            self.group_proven = base - on > self._needed(base, noise)
        label = "group proven" if self.group_proven else "group not faster"
        log.info("stitchfleet: %s at step %d: %s", label, step, self.group_probe)
        self.ledger.event("probe", step, None, label, detail=f"{label}: {self.group_probe}")
        return True

    def _probe_decision(
        self,
        step: int,
        c: Cluster,
        figures: np.ndarray[Any, np.dtype[np.float64]],
        signed: np.ndarray[Any, np.dtype[np.float64]],
    ) -> bool:
        """Keeps `c` or leaves it to TF from the summed probe figures (ready ranks, the enabled clusters' step
        with `c` on, the same without it, noise), then per signature from `signed` (`signature_verdicts`);
        False when its pair runs again instead (`_rerun`)."""
        if not c.enabled:
            return True  # reverted already (its own revert event says why)
        ready, with_it, without, noise, waiting = (float(x) for x in figures)
        if self._rerun(step, self.clusters.index(c), ready, waiting):
            return False
        if ready < self.size:
            self._leave(step, c, "no probe figures", f"{ready:.0f} of {self.size} ranks had timed both windows")
            return True
        with_it, without, noise = with_it / self.size, without / self.size, noise / self.size
        c.probe = self._describe(self.clusters.index(c), with_it, without, noise)
        needed = self._needed(without, noise)
        faster, slower = self._outcomes(signed)
        if self.group_proven:
            # the group's gain is real, and a cluster's small share of it is below one probe's noise: the
            # burden of proof flips, and only a cluster shown slower beyond the same bar is dropped
            if with_it - without > needed:
                self._leave_unless_faster(step, c, "slower than TF", faster, slower=True)
            else:
                self._keep(step, c, "kept with the group")
        elif without - with_it > needed:
            self._keep(step, c, "faster than TF")
        elif with_it >= without:
            self._leave_unless_faster(step, c, "slower than TF", faster, slower=True)
        else:
            self._leave_unless_faster(step, c, "not faster beyond noise and margin", faster)
        self._withdraw_slower(step, c, slower)
        return True

    def _leave_unless_faster(
        self, step: int, c: Cluster, label: str, faster: list[Any], *, slower: bool = False
    ) -> None:
        """Leaves `c` to TF, unless it was faster at some signatures: then it stays on for those only."""
        if slower:  # the finding about the signature it was decided on holds either way
            self.ledger.probed(c.fingerprint, c.profile, self.measured(c), "slower", f"{label}: {c.probe}")
        if not self._keep_where_faster(step, c, faster, f"{label}: {c.probe}"):
            self._leave(step, c, label, c.probe)

    def _describe(self, subject: int, on: float, base: float, noise: float) -> str:
        """A probe's figures, e.g. "-0.41 ms/step (2.49 vs 2.90 ms, 9+10 steps, noise 0.05 ms)": this rank's
        timed steps switched on + baseline (check steps are not timed)."""
        signature = self.probes.measured(subject)
        counts = [len(half) for half in self.probes.halves(subject, signature)]
        steps = f"{counts[0]}+{counts[1]} steps" + (f" at {signature}" if signature else "")
        if self.probes.left_out.get(subject):
            steps += f", {self.probes.left_out[subject]} on TF's ops left out"
        return (
            f"{(on - base) * 1e3:+.2f} ms/step ({on * 1e3:.2f} vs {base * 1e3:.2f} ms, {steps},"
            f" noise {noise * 1e3:.2f} ms)"
        )

    def _keep(self, step: int, c: Cluster, label: str) -> None:
        c.kept, c.reason = True, f"{label}: {c.probe}"
        log.info("stitchfleet: cluster %d kept at step %d: %s", c.index, step, c.reason)
        self.ledger.event("cluster_enabled", step, c.fingerprint, label, detail=c.reason)
        self.ledger.verdict(c.fingerprint, "enabled", c.reason, c.op_count)
        self.ledger.probed(c.fingerprint, c.profile, self.measured(c), "faster", c.reason)

    def _leave(self, step: int, c: Cluster, label: str, detail: str, *, slower: bool = False) -> None:
        c.kept, c.enabled, c.reason = False, False, f"{label}: {detail}"
        log.info("stitchfleet: cluster %d left to TF at step %d: %s", c.index, step, c.reason)
        self.ledger.event("probe", step, c.fingerprint, label, detail=c.reason)
        self.ledger.verdict(c.fingerprint, "disabled", c.reason, c.op_count)
        if slower:
            self.ledger.probed(c.fingerprint, c.profile, self.measured(c), "slower", c.reason)

    def measured(self, c: Cluster) -> str:
        """The shapes `c`'s probe timed (`verdict_keys.shape_signature` of its kernel for the signature it was
        decided on); begin's (`Cluster.shapes`) with static shapes or when its kernel for it is unknown."""
        signature = self.probes.measured(self.clusters.index(c))
        found = self.kernels.shapes_of(c.index, signature) if signature and self.kernels is not None else None
        return found or c.shapes

    def _settle(self, step: int) -> None:
        """After the last probe: with no cluster kept, stitching is off for the job (not an error)."""
        if any(c.enabled and c.kept for c in self.clusters):
            return
        self.stitching_off = "no cluster kept: none passed its probe; the job runs TF's own ops"
        log.info("stitchfleet: stitching off for the job at step %d: %s", step, self.stitching_off)
        self.ledger.event("probe", step, None, "no cluster kept", detail=self.stitching_off)
