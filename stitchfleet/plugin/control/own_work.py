"""The plugin's own work on a step, outside its timed run: what plain TF never pays, charged to stitched windows.

Input: a clock, and the hook's marks of a step: entered, planned, its booking begun and ended, left. Output: per
step, the seconds of the plugin's work on it beyond its run (the booking's and the hook's after it go with the next
step). TF-free; the rules: docs/plugin/control.md ("The reference is a mean, and the plugin's own work ...").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class OwnWork:
    """The marks of the step in flight (see the module docstring); None where the hook has not made one."""

    clock: Callable[[], float]
    carried: float = 0.0  # the previous step's work after its run's figures: its booking, and the hook's after it
    planned_at: float | None = None  # when the step was entered (`entered`), else planned
    entered_at: float | None = None
    booking_at: float | None = None  # the previous booking's start: `left` measures from there
    total: float = 0.0  # every booked step's own work so far: what `plugin_cost.PluginCost` splits

    def entered(self) -> None:
        """The hook's first line of a training step: its work from here to the plan is the plugin's own too."""
        self.entered_at = self.clock()

    def planned(self) -> None:
        self.planned_at = self.entered_at if self.entered_at is not None else self.clock()
        self.entered_at = None

    def booking(self, seconds: float) -> tuple[float, float]:
        """The booking of a step whose run took `seconds` starts: (its start, the step's own work so far)."""
        started = self.clock()
        planned, self.planned_at = self.planned_at, None
        own = self.carried + (max(started - planned - seconds, 0.0) if planned is not None else 0.0)
        self.total += own
        return started, own

    def booked(self, started: float) -> None:
        """The booking that began at `started` ended: its time goes with the next step, unless `left` says more."""
        self.carried, self.booking_at = self.clock() - started, started

    def left(self) -> None:
        """The hook's last line of a step: its work after the booking (polling the guard's results, releasing the
        run) goes with the next step too."""
        if self.booking_at is not None:
            self.carried, self.booking_at = self.clock() - self.booking_at, None
