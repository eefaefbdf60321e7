"""What a single-rank job's run leaves for its next run on the node: the figure its setup decision weighs.

Input: the job's controller at its end and the seconds it paid that a warm run pays again. Output: a
`setup_record.Measured` (the steady stitched gain; else, once stitching ended off, the group probe's or the slowdown
guard's figure), or None when it measured nothing a next run should weigh. Rules: docs/plugin/setup.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from stitchfleet.plugin.control.schedule import GROUP
from stitchfleet.plugin.guard.numeric import Finding
from stitchfleet.plugin.setup import setup_record
from stitchfleet.plugin.setup.setup_record import Measured

if TYPE_CHECKING:
    from stitchfleet.plugin.control.controller import Controller


def figures(controller: Controller, per_run: float) -> Measured | None:
    """The steady stitched steps' paired gain when there were enough; else, once stitching is over (`done`), the
    slowdown guard's figures when it reverted the job, or the group probe's when the group was not faster. None
    while still stitching, after a plugin error, a non-finite loss or a cluster the guard reverted (`_guarded`), or
    when the fleet's memory decided the group without a probe. With them, the user's graph's usual step (its last
    baseline block's median): the step time the next run weighs its setup by when no one states it."""
    found = _figures(controller, per_run)
    usual = controller.windows.usual
    return replace(found, plain_step=usual) if found is not None and usual is not None and usual > 0 else found


def _figures(controller: Controller, per_run: float) -> Measured | None:
    windows = controller.windows
    steady = setup_record.measured(windows.steady_gain, windows.steady_steps, per_run, windows.steady_noise)
    if steady is not None or not controller.done or _guarded(controller):
        return steady
    if controller.course.slowdown is not None:
        return _share(controller.course.slowdown, 0, per_run, setup_record.SLOWDOWN)
    found, probes = controller.decisions.group_figures, controller.probes
    if controller.job_reverted is not None or controller.group_proven is not False or found is None:
        return None
    steps = sum(map(len, probes.halves(GROUP, probes.measured(GROUP))))
    return _share(found, steps, per_run, setup_record.GROUP)


def _guarded(controller: Controller) -> bool:
    """Whether the guard reverted a cluster in this run: a numeric mismatch (`Finding`), or a kernel that failed or
    gave NaN/Inf (`ClusterKernel.bad`). No loss is recorded then: a wrong kernel is a fault (the fleet's reverted
    verdict, the report's revert figures), not the graph's speed, and what the run timed after ran without it (a
    fixed kernel is new code, whose record starts afresh). A cluster an earlier job's revert started off is not."""
    pending = controller.pending
    return any(
        isinstance(pending.get(k), Finding) or c.kernel.bad is not None for k, c in enumerate(controller.clusters)
    )


def _share(medians: tuple[float, float, float], steps: int, per_run: float, source: str) -> Measured | None:
    """(stitched, plain TF's, noise) medians in seconds as the share of plain TF's step saved, with its noise."""
    stitched, base, noise = medians
    return Measured((base - stitched) / base, steps, per_run, source, noise / base) if base > 0 else None
