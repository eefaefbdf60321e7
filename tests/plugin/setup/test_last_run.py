"""What a run leaves for its next run on the node when its stitching ended off without steady stitched steps
(`setup.last_run`, issue 29): the group probe's figure when the group was not faster, the slowdown guard's when it
reverted the job; nothing after a numeric revert, nothing while the job still stitched (TF-free: the probe
controller's synthetic step times on real sim kernels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stitchfleet.plugin.guard.numeric import Finding
from stitchfleet.plugin.setup import last_run, setup_record
from tests.plugin.control.conftest import kernels  # noqa: F401 (the sim kernels these controllers run)
from tests.plugin.control.test_probe_controller import GROUP_STEPS, GROUPED, _controller, _drive, _step_time

PER_RUN = 1.5


def test_a_group_not_faster_leaves_its_probe_figure(tmp_path: Path, kernels: Any) -> None:  # noqa: F811
    """Every cluster on +0.91 ms on a 3 ms step: the group is not faster and, the job's length unknown, the
    per-cluster probes are skipped; stitching is off with no steady stitched step. Before, the run left nothing
    and its next run on the node set up and probed again."""
    controller = _controller(tmp_path, kernels, job_steps=None, **GROUPED)
    _drive([controller], [_step_time(3.0, [0.2, 0.41, 0.3], jitter=0.001)], steps=12)
    assert controller.group_proven is False and controller.stitching_off is not None
    assert controller.windows.steady_steps == 0
    found = last_run.figures(controller, PER_RUN)
    assert found is not None and found.source == setup_record.GROUP
    assert controller.decisions.group_figures is not None
    on, base, noise = controller.decisions.group_figures
    assert found.gain == pytest.approx((base - on) / base) and found.gain == pytest.approx(-0.91 / 3.0, abs=0.01)
    assert found.noise == pytest.approx(noise / base) and found.steps == 7 and found.per_run == PER_RUN
    assert found.expected() == found.gain
    assert found.said().startswith("its last run here measured every cluster on 30.")


def test_a_group_under_the_margin_and_no_cluster_kept_expects_nothing_of_a_rerun(tmp_path: Path, kernels: Any) -> None:  # noqa: F811
    """-0.02 ms together, under the margin: not faster; each cluster then probed and none kept. The figure is kept
    as measured (favourable), but a rerun that decides alike stitches nothing: even its upper bound is under the
    probe's margin, so it expects no gain."""
    controller = _controller(tmp_path, kernels, **GROUPED)
    _drive([controller], [_step_time(3.0, [-0.02, -0.01, 0.01], jitter=0.001)], steps=GROUP_STEPS)
    assert controller.group_proven is False and not any(c.kept for c in controller.clusters) and controller.done
    found = last_run.figures(controller, PER_RUN)
    assert found is not None and found.source == setup_record.GROUP and found.gain > 0
    margin = controller.timing.probe_margin
    assert found.gain + 2 * found.noise < margin and found.expected(margin) == 0.0


def test_a_slowdown_revert_leaves_the_guards_figure(tmp_path: Path, kernels: Any) -> None:  # noqa: F811
    """The probes keep all three clusters, then the stitched phase runs 2 ms a step slower than plain TF and the
    slowdown guard reverts the job on its first two verdicts (steps 37 and 79), with too few steady steps for a steady
    figure; the figure kept is the two verdicts' mean."""
    controller = _controller(tmp_path, kernels)
    probing = _step_time(3.0, [-0.5, -0.5, -0.5])

    def slower_when_stitched(step: int, on: Any) -> float:
        return probing(step, on) + (2e-3 if step >= 27 and on.any() else 0.0)

    _drive([controller], [slower_when_stitched], steps=90)
    assert controller.job_reverted is not None and controller.course.slowdown is not None
    assert controller.windows.steady_steps < setup_record.MIN_STEADY_STEPS
    stitched, base, noise = controller.course.slowdown
    found = last_run.figures(controller, PER_RUN)
    assert found is not None and found.source == setup_record.SLOWDOWN
    assert found.gain == pytest.approx((base - stitched) / base) and found.gain < -0.1
    assert found.noise == pytest.approx(noise / base)
    assert "reverted by the slowdown guard" in found.said()


def test_a_numeric_revert_leaves_no_loss(tmp_path: Path, kernels: Any) -> None:  # noqa: F811
    """The same losing group as above, but the guard found a cluster's output wrong on a check step of the group
    probe: a wrong kernel is a fault, not the graph's speed, and the group then measured ran without it."""
    controller = _controller(tmp_path, kernels, job_steps=None, **GROUPED)
    bad = Finding(False, "out", 1.0, 1e-6, "max error 1 > allowed 1e-06")
    seconds = _step_time(3.0, [0.2, 0.41, 0.3], jitter=0.001)
    check_step = next(s for s in range(12) if controller.checks(s) and controller.timing.grouped(s))
    for step in range(12):
        local, checked = controller.local(step), controller.checks(step)
        controller.timed(step, seconds(step, controller.switches(step)) + (0.05 if checked else 0.0), checked)
        if step == check_step:
            controller.checked(step, 0, bad)
        controller.decide(step, local)
    controller.finish()
    controller.ledger.close()
    assert controller.clusters[0].reverted_at is not None and controller.group_proven is False and controller.done
    assert controller.decisions.group_figures is not None  # measured, yet not recorded
    assert last_run.figures(controller, PER_RUN) is None


def test_a_job_still_stitching_without_enough_steady_steps_leaves_nothing(tmp_path: Path, kernels: Any) -> None:  # noqa: F811
    controller = _controller(tmp_path, kernels, **GROUPED)
    _drive([controller], [_step_time(3.0, [-0.5, -0.5, -0.5], jitter=0.001)], steps=GROUP_STEPS)
    assert controller.group_proven is True and not controller.done
    assert last_run.figures(controller, PER_RUN) is None
