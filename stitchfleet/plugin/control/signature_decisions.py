"""Probe decisions per shape signature: a kept cluster withdrawn where it was slower, a left one kept where
faster.

The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.schedule import Probes, median_noise
from stitchfleet.plugin.fleet.ledger import Ledger

log = logging.getLogger("stitchfleet.plugin")
NOISE_FACTOR = 2.0  # a kept cluster beats its baseline by this many standard errors (and by the margin)
SIGNATURE_SLOTS = 8  # signatures a cluster's probe decides on apart (twice STITCHFLEET_SIGNATURES_MAX's default)
SLOT = 6  # figures per slot: ranks, median with the cluster, median without it, noise, identity, identity squared
MIN_SIGNATURE_STEPS = 5  # timed steps a signature needs in each half of a probe pair to be decided on apart (3 let
# one stalled step pass for a 2x gain: a median and its spread from 3 samples are no evidence)
Allowed = frozenset[tuple[int, float]]  # (slot, identity) of the signatures a cluster keeps its kernels for


class SignatureLookup(Protocol):
    """What the controller asks of the kernels per shape signature (`signature_kernels.SignatureKernels`)."""

    def shapes_of(self, index: int, key: str) -> str | None: ...

    def withdraw(self, index: int, key: str, reason: str, step: int) -> bool: ...

    def restrict(self, index: int, allowed: Allowed, reason: str, step: int) -> list[str]: ...


def slot_of(key: str) -> tuple[int, float]:
    """(slot, identity) of signature `key`: the same on every rank; the identity an integer in [1, 2**20], so
    sums of a few thousand ranks' identities and of their squares stay exact in float64."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return digest % SIGNATURE_SLOTS, float((digest >> 8) % 2**20 + 1)


@dataclass(frozen=True)
class SignatureFigures:
    """One slot's summed figures, as means over the ranks that sent them."""

    slot: int
    identity: float
    ranks: float
    with_it: float
    without: float
    noise: float

    def describe(self) -> str:
        return (
            f"{(self.with_it - self.without) * 1e3:+.2f} ms/step ({self.with_it * 1e3:.2f} vs"
            f" {self.without * 1e3:.2f} ms on {self.ranks:.0f} rank(s), noise {self.noise * 1e3:.2f} ms)"
        )


def summed_slots(figures: NDArray[np.float64]) -> list[SignatureFigures]:
    """The slots of summed figures that hold one signature on every rank that sent them (module docstring)."""
    found = []
    for slot, row in enumerate(figures.reshape(SIGNATURE_SLOTS, SLOT)):
        ranks, with_it, without, noise, identities, squares = (float(x) for x in row)
        if ranks < 1 or identities * identities != ranks * squares:
            continue  # nothing timed enough there, or ranks' different signatures met in the slot
        found.append(SignatureFigures(slot, identities / ranks, ranks, with_it / ranks, without / ranks, noise / ranks))
    return found


def needed(base: float, noise: float, margin: float) -> float:
    """The difference a probe must show: the margin (worth the risk) and the noise (not a lucky draw:
    keeping the clusters whose noise happened to be most negative made the kept set slower together
    than apart)."""
    return max(base * margin, NOISE_FACTOR * noise)


class SignatureDecisions:
    """The per-signature probe decisions: holds what it reads (the clusters, this rank's probe samples, the kernels
    per signature, the ledger) and the probe margin; `ProbeDecisions` owns it."""

    def __init__(
        self, clusters: list[Cluster], ledger: Ledger, probes: Probes, kernels: SignatureLookup | None, margin: float
    ) -> None:
        self.clusters, self.ledger, self.probes, self.kernels, self.margin = clusters, ledger, probes, kernels, margin

    def figures(self, k: int | None) -> NDArray[np.float64]:
        """For cluster k decided now: per slot, [1, median with k, median without it, noise, identity, identity^2]
        of the signature this rank timed most there (MIN_SIGNATURE_STEPS in each half at least, or the pair's own
        `probe_min_steps` when more); zeros elsewhere."""
        figures = np.zeros((SIGNATURE_SLOTS, SLOT))
        best: dict[int, int] = {}
        least = max(MIN_SIGNATURE_STEPS, self.probes.timing.probe_min_steps)
        for key in self.probes.signatures(k) if k is not None else ():
            with_it, without = self.probes.halves(k, key)  # type: ignore[arg-type]  # k is not None here
            steps = min(len(with_it), len(without))
            slot, identity = slot_of(key)
            if key and steps >= least and steps > best.get(slot, 0):
                best[slot] = steps
                noise = median_noise(with_it, without)
                median_with, median_without = statistics.median(with_it), statistics.median(without)
                figures[slot] = [1.0, median_with, median_without, noise, identity, identity * identity]
        return figures.ravel()

    def outcomes(self, figures: NDArray[np.float64]) -> tuple[list[SignatureFigures], ...]:
        """(faster, slower): the decided slots where the cluster beat TF's ops, or lost to them, beyond the bar."""
        slots = summed_slots(figures)
        faster = [f for f in slots if f.without - f.with_it > needed(f.without, f.noise, self.margin)]
        slower = [f for f in slots if f.with_it - f.without > needed(f.without, f.noise, self.margin)]
        return faster, slower

    def _known(self, c: Cluster, wanted: list[SignatureFigures]) -> list[str]:
        """The signatures this rank timed in `c`'s probe that `wanted` slots decided on."""
        slots = {(f.slot, f.identity) for f in wanted}
        return [key for key in self.probes.signatures(self.clusters.index(c)) if key and slot_of(key) in slots]

    def withdraw_slower(self, step: int, c: Cluster, slower: list[SignatureFigures]) -> None:
        """A kept cluster loses its kernel for each signature where it was slower; it keeps the others."""
        if self.kernels is None or not (c.enabled and c.kept):
            return
        for key in self._known(c, slower):
            figures = next(f for f in slower if (f.slot, f.identity) == slot_of(key))
            shapes = self.kernels.shapes_of(c.index, key)
            detail = f"cluster {c.index} at {key}: {figures.describe()}; its other signatures keep their kernels"
            if self.kernels.withdraw(c.index, key, f"slower than TF at these shapes: {detail}", step):
                log.info("stitchfleet: kernel withdrawn at step %d: %s", step, detail)
                self.ledger.event("probe", step, c.fingerprint, "slower at a signature", detail=detail)
                if shapes is not None:
                    self.ledger.probed(c.fingerprint, c.profile, shapes, "slower", detail)

    def keep_where_faster(self, step: int, c: Cluster, faster: list[SignatureFigures], left: str) -> bool:
        """A cluster its probe would leave to TF (`left`: why) stays on, restricted to the signatures where it was
        faster: its other signatures' kernels are withdrawn (`SignatureLookup.restrict`). False without any."""
        if not faster or self.kernels is None:
            return False
        shapes = {key: self.kernels.shapes_of(c.index, key) for key in self._known(c, faster)}
        allowed: Allowed = frozenset((f.slot, f.identity) for f in faster)
        known = {slot_of(key): key for key in shapes}
        said = "; ".join(
            f"at {known.get((f.slot, f.identity), 'one this rank did not time')}: {f.describe()}" for f in faster
        )
        c.kept, c.reason = True, f"faster than TF at {len(faster)} signature(s) only: {said}; elsewhere {left}"
        withdrawn = self.kernels.restrict(c.index, allowed, f"kept at other signatures only: {left}", step)
        log.info("stitchfleet: cluster %d kept at step %d: %s", c.index, step, c.reason)
        detail = f"{c.reason}; kernels withdrawn: {', '.join(withdrawn) or 'none'}"
        self.ledger.event("cluster_enabled", step, c.fingerprint, "faster at some signatures", detail=detail[:1000])
        self.ledger.verdict(c.fingerprint, "enabled", c.reason, c.op_count)
        for found in shapes.values():
            if found is not None:
                self.ledger.probed(c.fingerprint, c.profile, found, "faster", c.reason)
        return True
