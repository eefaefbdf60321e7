"""The plugin's own cost on a job beyond what the user's graph costs, measured, split by who pays it.

Input: a controller's own-work clock (`OwnWork.total`: the plugin's work around every step it planned) and what of it
the stitched and probe windows' savings pay (`Controller.own_charged`). Output: `PluginCost`, whose `overhead` the
job books as its `rows.JobOverhead` (the report charges it beside the compile: net = gross - compile - overhead).
TF-free; what it does not see is said in docs/plugin/control.md ("The plugin's own cost").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stitchfleet.plugin.control.own_work import OwnWork


class Measured(Protocol):
    """What a controller exposes of its own-work clock (`Controller`)."""

    own_work: OwnWork
    own_charged: float


@dataclass(frozen=True)
class PluginCost:
    """Seconds of the plugin's work on a job's steps (wall clock, this rank): all of it, and the share stitched and
    probe windows pay in their savings (each such step is compared with plain TF's mean step, its own work added)."""

    own: float
    charged: float

    @property
    def overhead(self) -> float:
        """What no saving pays: the work on baseline, warmup and reverted steps (they run the user's graph, and a
        window of them books no saving), which plain TF never spends. Never negative."""
        return max(self.own - self.charged, 0.0)

    @classmethod
    def of(cls, controller: Measured) -> PluginCost:
        return cls(controller.own_work.total, controller.own_charged)
