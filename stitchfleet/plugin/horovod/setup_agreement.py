"""Before any decision, Horovod ranks agree on the clusters they all installed and on their setup.

Input: Output: the agreed cluster indices (installed on every rank), or None when any rank's setup failed. The
rules in full: docs/plugin/horovod.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

SLOTS = 512  # cluster indices a job can agree on; clusters past it stay with TF (a reason says so)
Vector = npt.NDArray[np.float64]

if TYPE_CHECKING:
    import tensorflow as tf


class Agreement:
    """The agreement allreduce, built in `begin` before anything of the rank's setup can fail."""

    def __init__(self, hvd: ModuleType, graph: tf.Graph) -> None:
        import tensorflow as tf

        self.size = int(hvd.size())
        with graph.as_default(), tf.name_scope("stitchfleet"):
            self.feed = tf.compat.v1.placeholder(tf.float64, [SLOTS + 1], name="agreement_in")
            self.summed = hvd.allreduce(self.feed, op=hvd.Sum, name="stitchfleet_agreement")

    @staticmethod
    def vector(installed: Sequence[int], ok: bool) -> Vector:
        """This rank's contribution: a flag per installed cluster index, then whether setup succeeded."""
        local = np.zeros(SLOTS + 1)
        local[[i for i in installed if 0 <= i < SLOTS]] = 1.0
        local[SLOTS] = float(ok)
        return local

    def args(self, local: Vector) -> tuple[dict[tf.Tensor, object], dict[str, tf.Tensor]]:
        return {self.feed: local}, {"agreement": self.summed}

    def decide(self, summed: Vector) -> list[int] | None:
        """The cluster indices every rank installed, or None when some rank's setup failed."""
        return agreed(summed, self.size)


def agreed(summed: Vector, size: int) -> list[int] | None:
    """The indices flagged by all `size` ranks in the summed vectors, or None when a rank's setup failed. A
    cluster one rank left off (a slower verdict only it read, a failed compile) is off on every rank."""
    if summed[SLOTS] < size:
        return None
    return [int(i) for i in np.flatnonzero(summed[:SLOTS] >= size)]
