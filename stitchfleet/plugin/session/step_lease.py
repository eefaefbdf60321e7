"""A lease of routine stitched steps: the hook runs them on one plan's arguments and books them in one call.

Input: the plan of a step the controller just booked, the `SessionRunArgs` that step ran with and how many steps
after it are routine (`control.routine.span`); then per leased step its seconds, signature figures, own work.
Output: the arguments of each leased step (the same object), and the rows `control.routine.book` books at its end.
The rules in full: docs/plugin/session.md ("Routine steps").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stitchfleet.plugin.control.routine import Row
from stitchfleet.plugin.control.step_contract import StepPlan

if TYPE_CHECKING:
    import tensorflow as tf


@dataclass
class Lease:
    """Steps `first` .. `first + count - 1`, each planned as `plan` (its step number aside) and run with `args`."""

    plan: StepPlan
    args: tf.compat.v1.train.SessionRunArgs | None  # None: the user's run as written (a baseline block's)
    first: int
    count: int
    loss: bool  # whether `args` fetch the loss: only for a run that computes it anyway (`StepArgs.reaches_loss`)
    rows: list[Row] = field(default_factory=list)  # the leased steps that ran, in order

    @property
    def next(self) -> int:
        """The step the lease runs next (past its end once every leased step ran)."""
        return self.first + len(self.rows)

    @property
    def over(self) -> bool:
        return len(self.rows) >= self.count

    def ran(self, seconds: float, measured: tuple[str | None, tuple[int, ...], str | None], own: float) -> None:
        self.rows.append((seconds, measured, own))
