"""What a single-rank job's run leaves for its next run on the node: the figure its setup decision weighs.

Input: the job's controller at its end (its windows, probe decisions, course of stitching, clusters) and the seconds
it paid that a warm run pays again. Output: a `setup_record.Measured` (the steady stitched gain; else, when stitching
ended off without steady stitched steps, the group probe's or the slowdown guard's figure), or None when the run
measured nothing its next run should weigh. Rules: docs/plugin/setup.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stitchfleet.plugin.control.schedule import GROUP
from stitchfleet.plugin.guard.numeric import Finding
from stitchfleet.plugin.setup import setup_record
from stitchfleet.plugin.setup.setup_record import Measured

if TYPE_CHECKING:
    from stitchfleet.plugin.control.controller import Controller


def figures(controller: Controller, per_run: float) -> Measured | None:
    """The run's figure for its next run here: its steady stitched steps' paired gain when it had enough of them;
    else, once stitching is over for the job (`Controller.done`), the slowdown guard's figures when it reverted the
    job, or the group probe's when the group was measured not faster (per-cluster probes skipped, or none kept);
    None otherwise (still stitching without enough steady steps, a plugin error, a non-finite loss, a cluster
    reverted by the guard, a group decided by the fleet's memory without a probe)."""
    windows = controller.windows
    steady = setup_record.measured(windows.steady_gain, windows.steady_steps, per_run)
    if steady is not None or not controller.done or _guarded(controller):
        return steady
    course = controller.course
    if course.slowdown is not None:
        stitched, baseline, noise = course.slowdown
        return _share((stitched, baseline, noise), 0, per_run, setup_record.SLOWDOWN)
    found = controller.decisions.group_figures
    if course.job_reverted is not None or controller.group_proven is not False or found is None:
        return None  # a plugin error or a non-finite loss says nothing of speed; the group was not measured here
    probes = controller.probes
    steps = sum(map(len, probes.halves(GROUP, probes.measured(GROUP))))
    return _share(found, steps, per_run, setup_record.GROUP)


def _guarded(controller: Controller) -> bool:
    """Whether the guard reverted a cluster in this run: a numeric mismatch (`Finding`), or its kernel failed or gave
    NaN/Inf (`ClusterKernel.bad`). Such a run records no loss: a wrong kernel is a fault for the fleet's reverted
    verdict and the report's revert figures, not a measurement of the graph's speed, and what the run probed or timed
    after it ran without that cluster (a fixed kernel is new code, whose setup record starts afresh anyway). Clusters
    an earlier job's revert started off are not this run's finding."""
    pending = controller.pending
    return any(
        isinstance(pending.get(k), Finding) or c.kernel.bad is not None for k, c in enumerate(controller.clusters)
    )


def _share(medians: tuple[float, float, float], steps: int, per_run: float, source: str) -> Measured | None:
    """(stitched, plain TF's, noise) step medians in seconds as the share of plain TF's step stitching saved, and
    its noise as a share of it."""
    stitched, base, noise = medians
    if base <= 0:
        return None
    return Measured((base - stitched) / base, steps, per_run, source, noise / base)
