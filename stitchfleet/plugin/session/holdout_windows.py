"""A holdout run's telemetry: its training steps, run as written and timed, booked as baseline windows.

Input: the job's `Ledger`, STITCHFLEET_WINDOW_STEPS, then the hook's queued quiet steps, a batch at a time, each (its
number from the hook's step 0, its run's seconds), and `finish` at the hook's end. Output: `StepWindow` rows of mode
baseline (nothing saved, no baseline figure), `window_steps` steps each and the last one partial, which the report's
held-out check reads as plain TF's step in a process of its own. Rules: docs/plugin/setup.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.telemetry.kinds import WindowMode


class HoldoutWindows:
    """The open window's figures; the hook's `_book_quiet` hands it one batch at a time (one thread: its lock)."""

    def __init__(self, ledger: Ledger, window_steps: int) -> None:
        self.ledger, self.size = ledger, window_steps
        self.index = 0  # the session's own window index (the ledger numbers it for the rank)
        self.first, self.last, self.count, self.seconds = 0, 0, 0, 0.0

    def quiet_steps(self, steps: Sequence[tuple[int, float]]) -> None:
        """Adds a batch of steps; a window of `window_steps` steps is recorded as it fills."""
        for step, seconds in steps:
            if self.count == 0:
                self.first = self.last = step
            # min and max: a second thread's training run may be queued out of its number's order
            self.first, self.last = min(self.first, step), max(self.last, step)
            self.count += 1
            self.seconds += seconds
            if self.count >= self.size:
                self._close()

    def finish(self) -> None:
        """At the hook's end: the last, partial window (the job's steps, every one booked)."""
        if self.count:
            self._close()

    def _close(self) -> None:
        self.ledger.window(
            window_index=self.index,
            first_step=self.first,
            last_step=self.last,
            iterations=self.count,
            mode=WindowMode.BASELINE.value,
            step_seconds_sum=self.seconds,
            baseline_step_seconds=None,  # no stitched step to compare with: the report pairs runs, not windows
            saved_seconds=0.0,
        )
        self.index += 1
        self.count, self.seconds = 0, 0.0
