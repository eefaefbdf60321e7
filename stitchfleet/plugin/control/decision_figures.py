"""The figures a step contributes to the ranks' sum, as a typed record: what the controller decides from.

Input: this rank's figures (`Controller.local`) or the vector Horovod summed (`decision_sums`). Output:
`DecisionFigures`, with named fields, packed to / unpacked from that float64 vector (cluster flags first,
then `EXTRA` figures in a fixed order: the layout every rank shares, so their sums line up).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from stitchfleet.plugin.control.signature_decisions import SIGNATURE_SLOTS, SLOT

Vector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GuardFigures:
    """Job-wide figures: a plugin fault, a non-finite loss, and a fresh slowdown bracket (`slowdown.Bracket`)
    with its stitched median, baseline median and noise."""

    fault: float = 0.0
    loss: float = 0.0
    fresh: float = 0.0
    stitched: float = 0.0
    baseline: float = 0.0
    noise: float = 0.0

    SIZE = 6


@dataclass(frozen=True)
class PairFigures:
    """A probe pair decided now (a cluster's, or the group's): ranks with figures, the switched-on half's median,
    the compared half's, noise, and ranks waiting for kernels (`ProbeDecisions.figures`)."""

    ready: float = 0.0
    on: float = 0.0
    base: float = 0.0
    noise: float = 0.0
    waiting: float = 0.0

    SIZE = 5


def _zeros() -> Vector:
    return np.zeros(SIGNATURE_SLOTS * SLOT)


@dataclass(frozen=True)
class DecisionFigures:
    """One step's figures: per cluster its bad flag, then the guard's, the decided cluster's pair, the group's
    pair and the decided cluster's per-signature slots (`signature_decisions`)."""

    flags: tuple[float, ...] = ()
    guard: GuardFigures = GuardFigures()
    cluster: PairFigures = PairFigures()
    group: PairFigures = PairFigures()
    signed: Vector = field(default_factory=_zeros)

    EXTRA = GuardFigures.SIZE + 2 * PairFigures.SIZE + SIGNATURE_SLOTS * SLOT  # the figures after the flags

    def pack(self) -> Vector:
        """The float64 vector the ranks sum: flags, then the EXTRA figures in the fields' order."""
        g, c, p = self.guard, self.cluster, self.group
        head = [g.fault, g.loss, g.fresh, g.stitched, g.baseline, g.noise]
        pairs = [c.ready, c.on, c.base, c.noise, c.waiting, p.ready, p.on, p.base, p.noise, p.waiting]
        return np.concatenate([np.asarray(self.flags, dtype=np.float64), head, pairs, self.signed]).astype(np.float64)

    @classmethod
    def unpack(cls, vector: Vector, clusters: int) -> DecisionFigures:
        """The record of a vector packed by `pack` (summed or not) with `clusters` flags."""
        values = np.asarray(vector, dtype=np.float64)
        if len(values) != clusters + cls.EXTRA:
            raise ValueError(f"a decision vector of {len(values)} figures, not {clusters} + {cls.EXTRA}")
        extra = [float(x) for x in values[clusters : clusters + GuardFigures.SIZE + 2 * PairFigures.SIZE]]
        guard, cluster, group = extra[:6], extra[6:11], extra[11:16]
        return cls(
            tuple(float(x) for x in values[:clusters]),
            GuardFigures(*guard),
            PairFigures(*cluster),
            PairFigures(*group),
            values[clusters + 16 :].copy(),
        )

    @classmethod
    def fault_only(cls, clusters: int) -> DecisionFigures:
        """What a rank that could not prepare its step contributes: its fault flag alone."""
        return cls((0.0,) * clusters, GuardFigures(fault=1.0))
