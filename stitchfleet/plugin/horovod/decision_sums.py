"""Agreement between ranks: each decision step's local figures, summed over all ranks.

Input: the graph (in `begin`) and, per step, this rank's vector of figures (bad flags per cluster, fault and
loss flags, step-time medians). Output: the vector summed over ranks, which every rank then turns into the
same switch decisions. The rules in full: docs/plugin/horovod.md.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from stitchfleet import settings as settings_module

if TYPE_CHECKING:
    import tensorflow as tf

Vector = npt.NDArray[np.float64]


def _horovod() -> ModuleType | None:
    """horovod.tensorflow when the job imported and initialised it with several ranks, else None."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() and hvd.size() > 1 else None
    except Exception:  # an uninitialised Horovod raises rather than answering
        return None


class Consensus:
    def __init__(self, current: settings_module.Settings) -> None:
        self.hvd = _horovod()
        self.rank = int(self.hvd.rank()) if self.hvd is not None else current.rank
        self.size = int(self.hvd.size()) if self.hvd is not None else current.world_size
        self.feed: tf.Tensor | None = None
        self.summed: tf.Tensor | None = None
        self.slots = 0  # cluster flags in the fixed-length vector (the controller's vector is padded to it)
        self.clusters = 0  # the controller's cluster flags, once ranks agreed on them

    def build(self, graph: tf.Graph, slots: int, extra: int) -> None:
        """Adds the allreduce of a fixed-length vector (`slots` cluster flags, `extra` figures) to the graph
        (Horovod only): its length is known before any rank compiles, so it is the same on every rank."""
        if self.hvd is None:
            return
        import tensorflow as tf

        self.slots = slots
        with graph.as_default(), tf.name_scope("stitchfleet"):
            self.feed = tf.compat.v1.placeholder(tf.float64, [slots + extra], name="consensus_in")
            self.summed = self.hvd.allreduce(self.feed, op=self.hvd.Sum, name="stitchfleet_consensus")

    def args(self, local: Vector) -> tuple[dict[tf.Tensor, object], dict[str, tf.Tensor]]:
        """(feeds, fetches) to add to a step: `local` (the controller's layout) padded to the fixed length."""
        if self.summed is None:
            return {}, {}
        padded = np.zeros(self.slots + len(local) - self.clusters)
        padded[: self.clusters], padded[self.slots :] = local[: self.clusters], local[self.clusters :]
        return {self.feed: padded}, {"consensus": self.summed}

    def result(self, local: Vector, fetched: Mapping[str, object]) -> Vector:
        """The summed vector in the controller's layout."""
        if self.summed is None:
            return local
        summed = np.asarray(fetched["consensus"], dtype=np.float64)
        return np.concatenate([summed[: self.clusters], summed[self.slots :]])
