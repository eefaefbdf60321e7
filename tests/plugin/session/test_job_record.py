"""What a run tells its job's next run on the node it pays again (`job_record.warm_cost`), TF-free: a probe
controller on real sim kernels, its setup seconds set as a cold and a warm BERT run of the corpus booked them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stitchfleet.plugin.control.plugin_cost import PluginCost
from stitchfleet.plugin.session import job_record
from tests.plugin.control.conftest import kernels  # noqa: F401 (the sim kernels these controllers run)
from tests.plugin.control.test_probe_controller import _controller, _drive, _step_time


def test_a_cold_run_counts_its_setup_less_only_what_the_cache_spares(tmp_path: Path, kernels: Any) -> None:  # noqa: F811
    """Session 28: the corpus BERT's cold run booked 8.2 s of setup, 5.6 s of it in `begin`, 4.3 s of that its
    compiles and translation checks. It told its next run 1.1 s (the setup less all of `begin`); that run set up on
    it, paid 2.4 s and lost. The conversion, mapping, twin and rewrite of `begin` are paid again by a warm run."""
    controller = _controller(tmp_path, kernels)
    _drive([controller], [_step_time(3.0, [-0.5, -0.5, -0.5])], steps=30)
    controller.setup_seconds = 5.6
    extra = controller.setup_total - controller.setup_seconds  # the warmup's executor builds, the first runs
    overhead = PluginCost.of(controller).overhead
    cold = job_record.warm_cost(controller, warm=False, cold=4.3)
    assert cold == pytest.approx(5.6 - 4.3 + extra + overhead)
    assert cold > extra + overhead + 1.0  # what the old figure (the setup less all of begin) left out
    # a warm run's whole setup is what the next warm run pays; what a cold run spared is never more than its begin
    assert job_record.warm_cost(controller, warm=True, cold=4.3) == pytest.approx(controller.setup_total + overhead)
    assert job_record.warm_cost(controller, warm=False, cold=99.0) == pytest.approx(extra + overhead)
