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

Then per signature (`_signature_decisions`): a kept cluster's probe also sends, per signature it timed at
least `MIN_SIGNATURE_STEPS` steps in both halves, that signature's figures in one of `SIGNATURE_SLOTS`
slots (the key's hash; with an identity figure, so two ranks' different signatures meeting in one slot are
seen and not decided on). A signature where the cluster was slower beyond the margin and the noise loses
its kernel on every rank that has it (`SignatureLookup.withdraw`: TF's ops serve that signature of that
cluster for the rest of the job; a binding, no graph, feed or collective changes), with a fleet finding
keyed by that kernel's shapes; the cluster stays on for its other signatures. Not done: the converse (a
cluster left to TF for the signature it was decided on, kept for another where it was faster).
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from stitchfleet.plugin.ledger import Ledger
from stitchfleet.plugin.schedule import GROUP, Probes, Timing, median_noise

if TYPE_CHECKING:
    from stitchfleet.plugin.controller import Cluster

log = logging.getLogger("stitchfleet.plugin")
NOISE_FACTOR = 2.0  # a kept cluster beats its baseline by this many standard errors (and by the margin)
SIGNATURE_SLOTS = 8  # signatures a cluster's probe decides on apart (STITCHFLEET_SIGNATURES_MAX's default)
SLOT = 5  # figures per slot: ranks, median with the cluster, median without it, noise, the signature's identity
MIN_SIGNATURE_STEPS = 3  # timed steps a signature needs in each half of a probe pair to be decided on apart


class SignatureLookup(Protocol):
    """What the controller asks of the kernels per shape signature (`signature_kernels.SignatureKernels`)."""

    def shapes_of(self, index: int, key: str) -> str | None: ...

    def withdraw(self, index: int, key: str, reason: str, step: int) -> bool: ...


def slot_of(key: str) -> tuple[int, float]:
    """(slot, identity) of signature `key` in a probe's per-signature figures: the same on every rank, the
    identity an integer below 2**20 + 1, so a sum of a few thousand ranks' identities stays exact."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return digest % SIGNATURE_SLOTS, float((digest >> 8) % 2**20 + 1)


class ProbeVerdicts:
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

    def _probe_decision(self, step: int, c: Cluster, figures: np.ndarray[Any, np.dtype[np.float64]]) -> bool:
        """Keeps `c` or leaves it to TF from the summed probe figures (ready ranks, the enabled clusters' step
        with `c` on, the same without it, noise); False when its pair runs again instead (`_rerun`)."""
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
        if self.group_proven:
            # the group's gain is real, and a cluster's small share of it is below one probe's noise: the
            # burden of proof flips, and only a cluster shown slower beyond the same bar is dropped
            if with_it - without > needed:
                self._leave(step, c, "slower than TF", c.probe, slower=True)
            else:
                self._keep(step, c, "kept with the group")
        elif without - with_it > needed:
            self._keep(step, c, "faster than TF")
        elif with_it >= without:
            self._leave(step, c, "slower than TF", c.probe, slower=True)
        else:
            self._leave(step, c, "not faster beyond noise and margin", c.probe)
        return True

    def signature_figures(self, k: int | None) -> list[float]:
        """For cluster k decided now: per slot, [1, median with k, median without it, noise, identity] of the
        signature this rank timed most there (at least MIN_SIGNATURE_STEPS in each half); zeros elsewhere."""
        figures = np.zeros((SIGNATURE_SLOTS, SLOT))
        if k is None:
            return [float(x) for x in figures.ravel()]
        best: dict[int, int] = {}
        for key in self.probes.signatures(k):
            with_it, without = self.probes.halves(k, key)
            steps = min(len(with_it), len(without))
            slot, identity = slot_of(key)
            if key and steps >= MIN_SIGNATURE_STEPS and steps > best.get(slot, 0):
                best[slot] = steps
                noise = median_noise(with_it, without)
                figures[slot] = [1.0, statistics.median(with_it), statistics.median(without), noise, identity]
        return [float(x) for x in figures.ravel()]

    def _signature_decisions(self, step: int, c: Cluster, figures: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """A kept cluster loses its kernel for each signature where it was slower than TF's ops beyond the margin
        and the noise (module docstring), on the ranks that timed that signature in its probe."""
        if not (c.enabled and c.kept) or self.kernels is None:
            return
        rows = figures.reshape(SIGNATURE_SLOTS, SLOT)
        k = self.clusters.index(c)
        for key in self.probes.signatures(k):
            slot, identity = slot_of(key)
            ranks, with_it, without, noise, identities = (float(x) for x in rows[slot])
            if not key or ranks < 1 or identities != ranks * identity:
                continue  # timed too little on every rank, or other ranks' signatures in the same slot
            with_it, without, noise = with_it / ranks, without / ranks, noise / ranks
            if with_it - without <= self._needed(without, noise):
                continue
            shapes = self.kernels.shapes_of(c.index, key)
            detail = (
                f"cluster {c.index} at {key}: {(with_it - without) * 1e3:+.2f} ms/step ({with_it * 1e3:.2f} vs"
                f" {without * 1e3:.2f} ms on {ranks:.0f} rank(s), noise {noise * 1e3:.2f} ms); its other signatures"
                " keep their kernels"
            )
            if self.kernels.withdraw(c.index, key, f"slower than TF at these shapes: {detail}", step):
                log.info("stitchfleet: kernel withdrawn at step %d: %s", step, detail)
                self.ledger.event("probe", step, c.fingerprint, "slower at a signature", detail=detail)
                if shapes is not None:
                    self.ledger.probed(c.fingerprint, c.profile, shapes, "slower", detail)

    def _needed(self, base: float, noise: float) -> float:
        """The difference a probe must show: the margin (worth the risk) and the noise (not a lucky draw:
        keeping the clusters whose noise happened to be most negative made the kept set slower together
        than apart)."""
        return max(base * self.timing.probe_margin, NOISE_FACTOR * noise)

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
