"""The per-step contract between the hook and the controller: what a step runs, and what it gave.

Input: nothing of its own; the controller fills a `StepPlan` (`Controller.step_plan`, before the step) and the
hook a `StepFigures` (after it). The rules in full: docs/plugin/control.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from stitchfleet.plugin.guard.numeric import Finding

Scalar = TypeVar("Scalar", bound=np.generic)


def frozen(values: ArrayLike, dtype: type[Scalar]) -> NDArray[Scalar]:
    """A read-only copy of `values`: a plan cannot be changed after the controller made it."""
    array = np.array(values, dtype=dtype)
    array.setflags(write=False)
    return array


NO_SWITCHES = frozen([], np.bool_)  # read-only, so every plan without switches or figures shares these (a quiet
NO_FIGURES = frozen([], np.float64)  # step's plan is made per step once stitching is over: it must cost little)


@dataclass(frozen=True)
class StepPlan:
    """What one training step runs. A `quiet` step runs as written (stitching is over for the job): no
    feed, fetch or collective is added, it is only timed. Otherwise the step always joins the consensus."""

    step: int
    quiet: bool = False
    switches: NDArray[np.bool_] = field(default_factory=lambda: NO_SWITCHES)  # per controller cluster
    on_twin: bool = False  # every switch off (and no executor to build): the user's own graph runs
    judged: tuple[int, ...] = ()  # the clusters (controller positions) whose check results are judged
    checks: bool = False  # fetch every cluster's check tensors (judged, or the warmup's check-executor build)
    local: NDArray[np.float64] = field(default_factory=lambda: NO_FIGURES)  # to sum over ranks


@dataclass(frozen=True)
class StepFigures:
    """What a planned step gave: its duration, its loss (None when not fetched), the guard's findings for
    the plan's judged clusters (none when the check tensors did not come back), the consensus vector
    summed over ranks (the controller's layout; None on a quiet step), a plugin fault seen in it, and the
    shape signature whose kernels ran its switched-on clusters (`measured`: its key, "" for a graph with
    static shapes, None while a switched-on cluster's kernel for it is still to come: such a step times no
    probe, `schedule.Probes`) with the clusters switched on that run TF's ops at that signature for good
    (`plain`: a step of theirs times no probe of theirs), and the step's own signature (`signature`: its key
    whatever its kernels, None when unknown; telemetry windows compare it with plain TF's steps of its
    signature, `step_windows`)."""

    seconds: float
    loss: float | None = None
    findings: tuple[tuple[int, Finding], ...] = ()
    summed: NDArray[np.float64] | None = None
    fault: str | None = None
    measured: str | None = ""
    plain: tuple[int, ...] = ()  # clusters (controller positions) switched on that ran TF's ops for good
    signature: str | None = ""
