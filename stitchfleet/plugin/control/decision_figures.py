"""The figures a step contributes to the ranks' sum, as a typed record: what the controller decides from.

Input: this rank's figures (`Controller.local`) or the vector Horovod summed (`decision_sums`). Output:
`DecisionFigures`, with named fields, packed to / unpacked from that float64 vector (cluster flags first,
then `EXTRA` figures in a fixed order: the layout every rank shares, so their sums line up).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field

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
        figures = [*astuple(self.guard), *astuple(self.cluster), *astuple(self.group)]
        return np.concatenate([np.asarray(self.flags, dtype=np.float64), figures, self.signed]).astype(np.float64)

    @classmethod
    def unpack(cls, vector: Vector, clusters: int) -> DecisionFigures:
        """The record of a vector packed by `pack` (summed or not) with `clusters` flags."""
        values = np.asarray(vector, dtype=np.float64)
        if len(values) != clusters + cls.EXTRA:
            raise ValueError(f"a decision vector of {len(values)} figures, not {clusters} + {cls.EXTRA}")
        guard_end = clusters + GuardFigures.SIZE
        cluster_end = guard_end + PairFigures.SIZE
        group_end = cluster_end + PairFigures.SIZE

        def part(start: int, end: int) -> list[float]:
            return [float(x) for x in values[start:end]]

        return cls(
            tuple(part(0, clusters)),
            GuardFigures(*part(clusters, guard_end)),
            PairFigures(*part(guard_end, cluster_end)),
            PairFigures(*part(cluster_end, group_end)),
            values[group_end:].copy(),
        )

    @classmethod
    def fault_only(cls, clusters: int) -> DecisionFigures:
        """What a rank that could not prepare its step contributes: its fault flag alone."""
        return cls((0.0,) * clusters, GuardFigures(fault=1.0))
