"""How a probe pair's figures become a decision: the group proven or not, each cluster kept or left to TF.

Input: the summed probe figures of a decision step (ready ranks, the switched-on half's median, the compared
half's median, noise; each a sum over ranks), the clusters, the timing, this rank's probe samples and the
`Ledger`. The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.typing import NDArray

from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.decision_figures import PairFigures
from stitchfleet.plugin.control.schedule import GROUP, Probes, Timing
from stitchfleet.plugin.control.signature_decisions import (
    NOISE_FACTOR,
    SignatureDecisions,
    SignatureFigures,
    SignatureLookup,
    needed,
)
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.fleet.verdict_keys import group_key
from stitchfleet.telemetry.kinds import ProbeOutcome

log = logging.getLogger("stitchfleet.plugin")
__all__ = ["NOISE_FACTOR", "ProbeDecisions"]


class ProbeDecisions:
    """The probe decisions of one job: owns the probe schedule (`timing`, replaced when a pair runs again), this
    rank's probe samples (`probes`), the group's decision and the per-signature decisions (`signatures`)."""

    def __init__(
        self, clusters: list[Cluster], ledger: Ledger, size: int, timing: Timing, kernels: SignatureLookup | None
    ) -> None:
        self.clusters, self.ledger, self.size, self.timing = clusters, ledger, size, timing
        self.probes = Probes(timing)
        self.signatures = SignatureDecisions(clusters, ledger, self.probes, kernels, timing.probe_margin)
        self.group_proven: bool | None = None  # the group probe's decision; None until taken (or without one)
        self.group_probe = ""  # what the group probe measured, in a cluster's `probe` format
        self.group_figures: tuple[float, float, float] | None = None  # as decided, per rank: on, base, noise (s)
        self.group_finding: ProbeOutcome | None = None  # told the fleet (and `job_verdict`): beyond margin and noise
        self.rerun_futile = False  # a pair ran out of reruns without figures: no pair runs again (`rerun`)

    @property
    def kernels(self) -> SignatureLookup | None:
        return self.signatures.kernels

    @kernels.setter
    def kernels(self, kernels: SignatureLookup | None) -> None:
        self.signatures.kernels = kernels

    def retime(self, timing: Timing) -> None:
        """A new schedule (the fleet decided some pairs, the probes stopped), for the samples alike."""
        self.timing = self.probes.timing = timing

    def known(self, step: int, c: Cluster, faster: bool, reason: str) -> None:
        """`c` decided by the fleet's memory, without a probe (`Controller._recall`)."""
        c.probe = f"probe skipped: {reason}"
        log.info("stitchfleet: cluster %d %s", c.index, c.probe)
        self.ledger.event("probe", step, c.fingerprint, "probe skipped: known to the fleet", detail=c.probe)
        if faster:
            self.keep(step, c, "known faster", finding=False)
        else:
            self.leave(step, c, "known slower", c.probe)

    def known_group(self, step: int, faster: bool, reason: str) -> None:
        """The group decided by the fleet's memory, without its probe."""
        self.group_proven, self.group_probe = faster, f"group probe skipped: {reason}"
        label = "group proven" if faster else "group not faster"
        log.info("stitchfleet: %s at step %d: %s", label, step, self.group_probe)
        self.ledger.event("probe", step, None, f"{label} (known to the fleet)", detail=f"{label}: {self.group_probe}")

    def figures(self, k: int | None) -> PairFigures:
        """For the cluster (or GROUP) decided now: [1, switched-on median, paired baseline median, noise, 0];
        [0, 0, 0, 0, waiting] when this rank has not timed both halves, `probe_min_steps` steps each at one
        signature (waiting: 1 when a rerun may give figures: kernels still to come, first calls left out, too
        few steps: `Probes.waiting`); zeros when nothing is decided. Ranks decide from these figures summed."""
        if k is None:
            return PairFigures()
        found = self.probes.medians(k)
        if found is None:
            return PairFigures(waiting=float(self.probes.waiting(k)))
        return PairFigures(1.0, found[0], found[1], self.probes.noise(k))

    def _least(self) -> str:
        """What "timed" asks of a half when that is more than one step (`Timing.probe_min_steps`)."""
        least = self.timing.probe_min_steps
        return f" ({least} steps each at one signature)" if least > 1 else ""

    def _needed(self, base: float, noise: float) -> float:
        return needed(base, noise, self.timing.probe_margin)

    def rerun(self, step: int, subject: int, ready: float, waiting: float) -> bool:
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
            f"{name}: {ready:.0f} of {self.size} ranks had timed both halves, {waiting:.0f} waiting for kernels"
            " or steps; its pair runs again"
            f" ({done + 1} of at most {self.timing.probe_reruns})"
        )
        log.info("stitchfleet: probe rerun at step %d: %s", step, detail)
        fingerprint = None if subject == GROUP else self.clusters[subject].fingerprint
        self.ledger.event("probe", step, fingerprint, "probe rerun", detail=detail)
        return True

    def extend(self, step: int, on: float, base: float, noise: float) -> bool:
        """Runs the group's pair again, its samples pooled, when every cluster on measured faster beyond the margin
        but not beyond the noise, or slower by no more than the noise (one pair's noise on a 2-core machine is about
        the group's whole gain: docs/plugin/control.md); says whether it does. At most `probe_reruns` times."""
        gain = base - on  # a gain under the margin is decided at once: more samples cannot lift it
        faster = gain > base * self.timing.probe_margin
        unsure = gain <= self._needed(base, noise) if faster else gain < 0 and -gain <= NOISE_FACTOR * noise
        if not unsure or self.rerun_futile:
            return False
        done = self.timing.reruns_of(GROUP)
        if done >= self.timing.probe_reruns:
            return False
        self.timing = self.timing.rerun(step, GROUP)
        self.probes.timing = self.timing
        detail = (
            f"group: {self.describe(GROUP, on, base, noise)}: {'faster' if faster else 'slower'}, not beyond the noise;"
            " its pair runs again"
            f" ({done + 1} of at most {self.timing.probe_reruns})"
        )
        log.info("stitchfleet: probe rerun at step %d: %s", step, detail)
        self.ledger.event("probe", step, None, "probe rerun", detail=detail)
        return True

    def group(self, step: int, figures: PairFigures) -> bool:
        """Proves the group (every cluster on) or not, from the summed group figures; False when its pair
        runs again instead (`rerun`)."""
        ready, on, base, noise, waiting = figures.ready, figures.on, figures.base, figures.noise, figures.waiting
        if self.rerun(step, GROUP, ready, waiting):
            return False
        if ready < self.size:
            self.group_proven = False
            self.group_probe = (
                f"no group figures: {ready:.0f} of {self.size} ranks had timed both windows{self._least()}"
            )
        else:
            on, base, noise = on / self.size, base / self.size, noise / self.size
            if self.extend(step, on, base, noise):
                return False
            self.group_probe = self.describe(GROUP, on, base, noise)
            needed = self._needed(base, noise)
            self.group_proven = base - on > needed
            self.group_figures = (on, base, noise)
            if self.group_proven or on - base > needed:  # a finding for the fleet beyond margin and noise either way
                self.group_finding = ProbeOutcome.FASTER if self.group_proven else ProbeOutcome.SLOWER
                fingerprint, profile, shapes = group_key([(c.fingerprint, c.profile, c.shapes) for c in self.clusters])
                self.ledger.probed(fingerprint, profile, shapes, self.group_finding, f"group: {self.group_probe}")
        label = "group proven" if self.group_proven else "group not faster"
        log.info("stitchfleet: %s at step %d: %s", label, step, self.group_probe)
        self.ledger.event("probe", step, None, label, detail=f"{label}: {self.group_probe}")
        return True

    def cluster(
        self,
        step: int,
        c: Cluster,
        figures: PairFigures,
        signed: NDArray[np.float64],
    ) -> bool:
        """Keeps `c` or leaves it to TF from the summed probe figures (ready ranks, the enabled clusters' step
        with `c` on, the same without it, noise), then per signature from `signed` (`signature_decisions`);
        False when its pair runs again instead (`rerun`)."""
        if not c.enabled:
            return True  # reverted already (its own revert event says why)
        ready, with_it, without, noise = figures.ready, figures.on, figures.base, figures.noise
        waiting = figures.waiting
        if self.rerun(step, self.clusters.index(c), ready, waiting):
            return False
        if ready < self.size:
            timed = f"{ready:.0f} of {self.size} ranks had timed both windows{self._least()}"
            self.leave(step, c, "no probe figures", timed)
            return True
        with_it, without, noise = with_it / self.size, without / self.size, noise / self.size
        c.probe = self.describe(self.clusters.index(c), with_it, without, noise)
        needed = self._needed(without, noise)
        faster, slower = self.signatures.outcomes(signed)
        if self.group_proven:
            # the group's gain is real, and a cluster's small share of it is below one probe's noise: the
            # burden of proof flips, and only a cluster shown slower beyond the same bar is dropped
            if with_it - without > needed:
                self.leave_unless_faster(step, c, "slower than TF", faster, slower=True)
            else:
                self.keep(step, c, "kept with the group")
        elif without - with_it > needed:
            self.keep(step, c, "faster than TF")
        elif with_it >= without:
            self.leave_unless_faster(step, c, "slower than TF", faster, slower=True)
        else:
            self.leave_unless_faster(step, c, "not faster beyond noise and margin", faster)
        self.signatures.withdraw_slower(step, c, slower)
        return True

    def leave_unless_faster(
        self, step: int, c: Cluster, label: str, faster: list[SignatureFigures], *, slower: bool = False
    ) -> None:
        """Leaves `c` to TF, unless it was faster at some signatures: then it stays on for those only."""
        if slower:  # the finding about the signature it was decided on holds either way
            self.ledger.probed(c.fingerprint, c.profile, self.measured(c), "slower", f"{label}: {c.probe}")
        if not self.signatures.keep_where_faster(step, c, faster, f"{label}: {c.probe}"):
            self.leave(step, c, label, c.probe)

    def describe(self, subject: int, on: float, base: float, noise: float) -> str:
        """A probe's figures, e.g. "-0.41 ms/step (2.49 vs 2.90 ms, 9+10 steps, noise 0.05 ms)": this rank's
        timed steps switched on + baseline (check steps are not timed)."""
        signature = self.probes.measured(subject)
        counts = [len(half) for half in self.probes.halves(subject, signature)]
        steps = f"{counts[0]}+{counts[1]} steps" + (f" at {signature}" if signature else "")
        if self.probes.left_out.get(subject):
            steps += f", {self.probes.left_out[subject]} on TF's ops left out"
        first = self.probes.first.get(subject, 0)
        if first:
            steps += f", {first} first call{'s' if first > 1 else ''} left out"
        return (
            f"{(on - base) * 1e3:+.2f} ms/step ({on * 1e3:.2f} vs {base * 1e3:.2f} ms, {steps},"
            f" noise {noise * 1e3:.2f} ms)"
        )

    def keep(self, step: int, c: Cluster, label: str, *, finding: bool = True) -> None:
        c.kept, c.reason = True, f"{label}: {c.probe}"
        log.info("stitchfleet: cluster %d kept at step %d: %s", c.index, step, c.reason)
        self.ledger.event("cluster_enabled", step, c.fingerprint, label, detail=c.reason)
        self.ledger.verdict(c.fingerprint, "enabled", c.reason, c.op_count)
        if finding:  # a probe's finding: not a decision taken without one (the fleet's, probes stopped)
            self.ledger.probed(c.fingerprint, c.profile, self.measured(c), "faster", c.reason)

    def leave(self, step: int, c: Cluster, label: str, detail: str, *, slower: bool = False) -> None:
        c.kept, c.enabled, c.reason = False, False, f"{label}: {detail}"
        log.info("stitchfleet: cluster %d left to TF at step %d: %s", c.index, step, c.reason)
        self.ledger.event("probe", step, c.fingerprint, label, detail=c.reason)
        self.ledger.verdict(c.fingerprint, "disabled", c.reason, c.op_count)
        if slower:
            self.ledger.probed(c.fingerprint, c.profile, self.measured(c), "slower", c.reason)

    def measured(self, c: Cluster) -> str:
        """The shapes `c`'s probe timed (`verdict_keys.input_shapes` of its kernel for the signature it was
        decided on); begin's (`Cluster.shapes`) with static shapes or when its kernel for it is unknown."""
        signature = self.probes.measured(self.clusters.index(c))
        found = (
            self.signatures.kernels.shapes_of(c.index, signature)
            if signature and self.signatures.kernels is not None
            else None
        )
        return found or c.shapes
