"""What the hook decides, step by step: switches, checks, windows, reverts. TF-free.

Input: the compiled clusters (`Cluster`: fingerprint, kernel, guard figures), the timing
schedule, a `Ledger` and, per step, its duration, check results and the consensus vector.
Output: the switch vector of every step, the local figures each step contributes to the
consensus (bad flags per cluster, plugin fault, non-finite loss, fresh step-time medians),
and every decision taken from the summed figures: a mismatching or non-finite cluster is
reverted for the rest of the job (fleet verdict `reverted`), a plugin fault, a non-finite
loss or a slowdown beyond the margin reverts the whole job. Decisions use only the summed
vector, so ranks that share it take the same decisions at the same step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchfleet.plugin.guard import Finding
from stitchfleet.plugin.ledger import Ledger
from stitchfleet.plugin.schedule import REVERTED, STITCHED, Timing, Window, Windows

log = logging.getLogger("stitchfleet.plugin")
EXTRA = 5  # fault, loss, fresh medians, stitched median, baseline median


@dataclass
class Cluster:
    index: int
    fingerprint: str
    kernel: Any
    op_count: int
    enabled: bool = True
    reverted_at: int | None = None
    reason: str = ""


class Controller:
    def __init__(self, clusters: list[Cluster], timing: Timing, ledger: Ledger, size: int = 1) -> None:
        self.clusters, self.timing, self.ledger, self.size = clusters, timing, ledger, size
        self.windows = Windows(timing.window_steps)
        self.job_reverted: str | None = None
        self.pending: dict[int, Finding | str] = {}
        self.fault: str | None = None
        self.loss_bad = False
        self.fresh = False
        self.announced = False

    @property
    def length(self) -> int:
        return len(self.clusters) + EXTRA

    def mode(self, step: int) -> str:
        phase = self.timing.phase(step)
        return REVERTED if self.job_reverted is not None and phase == STITCHED else phase

    def switches(self, step: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
        on = self.mode(step) == STITCHED
        return np.array([on and c.enabled for c in self.clusters], dtype=bool)

    def checks(self, step: int) -> bool:
        return self.mode(step) == STITCHED and self.timing.checks(step) and any(c.enabled for c in self.clusters)

    def local(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """This rank's figures for the step about to run (see the module docstring)."""
        flags = [float(i in self.pending or c.kernel.bad is not None) for i, c in enumerate(self.clusters)]
        base, stitched = self.windows.baseline_median, self.windows.stitched_median
        fresh = self.fresh and base is not None and stitched is not None
        self.fresh = False
        extra = [float(self.fault is not None), float(self.loss_bad), float(fresh), stitched or 0.0, base or 0.0]
        return np.array(flags + extra, dtype=np.float64)

    # --- after a step ---------------------------------------------------------------------

    def timed(self, step: int, seconds: float, checked: bool) -> None:
        """Books the step's time; closed windows become StepWindow rows."""
        mode = self.mode(step)
        if mode == STITCHED and not self.announced:
            self._announce(step)
        for window in self.windows.add(step, mode, seconds, timed=not checked):
            self._record(window)

    def _announce(self, step: int) -> None:
        self.announced = True
        for c in self.clusters:
            if c.enabled:
                self.ledger.event("cluster_enabled", step, c.fingerprint, "stitched path on")
                self.ledger.verdict(c.fingerprint, "enabled", op_count=c.op_count)

    def _record(self, window: Window) -> None:
        if window.mode == STITCHED:
            self.fresh = True
        self.ledger.window(
            window_index=window.index,
            first_step=window.first_step,
            last_step=window.last_step,
            iterations=window.iterations,
            mode=window.mode,
            step_seconds_sum=sum(window.seconds),
            baseline_step_seconds=window.baseline,
            saved_seconds=window.saved_seconds,
        )

    def checked(self, step: int, index: int, finding: Finding) -> None:
        if not finding.ok:
            self.pending.setdefault(index, finding)
            c = self.clusters[index]
            figures = _figures(finding)
            self.ledger.event("guard_check", step, c.fingerprint, "mismatch", passed=False, **figures)

    def decide(self, step: int, summed: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """Applies the summed figures of `step`; the new switches hold from the next step."""
        n = len(self.clusters)
        for i, c in enumerate(self.clusters):
            if summed[i] > 0 and c.enabled:
                self._revert_cluster(step, c, self.pending.get(i) or c.kernel.bad or "reverted on another rank")
        fault, loss, fresh, stitched, base = summed[n : n + EXTRA]
        if fault > 0:
            self._revert_job(step, "plugin error", self.fault or "a plugin error on another rank")
        elif loss > 0:
            self._revert_job(step, "non-finite loss", "the loss was NaN/Inf on a stitched step")
        elif fresh >= self.size and stitched > base * (1.0 + self.timing.slowdown_margin):
            mean_s, mean_b = stitched / self.size, base / self.size
            self._revert_job(step, "slowdown", f"stitched median {mean_s:.6f} s vs baseline {mean_b:.6f} s per step")

    def _revert_cluster(self, step: int, c: Cluster, why: Finding | str) -> None:
        c.enabled, c.reverted_at = False, step
        reason = "mismatch" if isinstance(why, Finding) else why
        figures = _figures(why) if isinstance(why, Finding) else {}
        detail = why.reason if isinstance(why, Finding) else why
        c.reason = f"{reason}: {detail}"
        log.warning("stitchfleet: cluster %d reverted at step %d: %s", c.index, step, c.reason)
        self.ledger.event("revert", step, c.fingerprint, reason, detail=detail, **figures)
        self.ledger.verdict(c.fingerprint, "reverted", c.reason, c.op_count)

    def _revert_job(self, step: int, reason: str, detail: str) -> None:
        if self.job_reverted is not None:
            return
        self.job_reverted = f"{reason}: {detail}"
        log.warning("stitchfleet: stitching reverted for the job at step %d: %s", step, self.job_reverted)
        self.ledger.event("revert", step, None, reason, detail=detail)

    def finish(self) -> None:
        window = self.windows.close()
        if window is not None:
            self._record(window)
        reverted = [c for c in self.clusters if c.reverted_at is not None]
        if self.job_reverted is not None:
            self.ledger.finished("reverted", self.job_reverted)
        else:
            self.ledger.finished("finished", "; ".join(f"cluster {c.index} {c.reason}" for c in reverted))


def _figures(finding: Finding) -> dict[str, Any]:
    error = finding.compiled_error
    return {"max_abs_error": error if np.isfinite(error) else None, "error_ratio": finding.ratio}
