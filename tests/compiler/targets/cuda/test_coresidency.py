"""coresidency.fit: grid-barrier kernels re-planned to what the device holds at once, still correct.

`holds` stands for the launch library's occupancy x SMs of the compiled kernel; here it is the
occupancy model of a device with fewer SMs than the plan assumed (a GPU shared with NCCL or MPS
looks like this to a cooperative launch). Re-planned kernels run on the sim against `evaluate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.devices import device, occupancy
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cuda.coresidency import CoresidencyError, fit
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.sim.target import run_lowered
from stitchfleet.compiler.tolerance import check_outputs

TINY = PlanOptions(device="tiny")


def _graph(name: str, shape: tuple[int, ...]) -> Graph:
    (cluster,) = find_clusters(build_case(name, shape, "f32"), 8).clusters
    return extract(build_case(name, shape, "f32"), cluster.nodes)


def _holds_on(sms: int) -> Callable[[CudaKernel], int]:
    small = dataclasses.replace(device("tiny"), sms=sms)

    def holds(kernel: CudaKernel) -> int:
        return occupancy(small, kernel.launch.block, 32, kernel.dynamic_smem_bytes).blocks_per_wave

    return holds


def _check_on_sim(graph: Graph, options: PlanOptions) -> None:
    lowered = lower(graph, plan_cluster(graph, 0, options))
    inputs = random_inputs(graph, 3)
    output_checks = check_outputs(
        run_lowered(lowered, graph, inputs), evaluate(graph, inputs), evaluate(graph, inputs, "float64")
    )
    assert all(v.ok for v in output_checks.values()), {name: v.reason for name, v in output_checks.items() if not v.ok}


def test_a_kernel_that_fits_is_left_as_planned() -> None:
    graph = _graph("few_long_rows", (2, 1500))
    fitted = fit(graph, 0, TINY, _holds_on(2))
    assert fitted.replans == () and fitted.options == TINY
    assert any(k.grid_barrier for k in fitted.kernels)


def test_a_grid_too_large_for_the_device_is_replanned_smaller_and_stays_correct() -> None:
    graph = _graph("few_long_rows", (2, 1500))
    planned = max(k.launch.grid for k in fit(graph, 0, TINY, _holds_on(2)).kernels)
    fitted = fit(graph, 0, TINY, _holds_on(1))  # half the SMs: half the blocks resident at once
    assert fitted.options.max_wave is not None and fitted.options.max_wave < planned
    assert len(fitted.replans) == 1 and "re-planned with at most" in fitted.replans[0]
    assert all(k.launch.grid <= fitted.options.max_wave for k in fitted.kernels if k.grid_barrier)
    _check_on_sim(graph, fitted.options)


def test_a_kernel_no_sm_can_hold_leaves_the_cluster_to_tf() -> None:
    graph = _graph("few_long_rows", (2, 1500))
    with pytest.raises(CoresidencyError, match="does not fit on one SM at all"):
        fit(graph, 0, TINY, lambda kernel: 0)


def test_a_shrinking_device_is_followed_down_to_a_plan_without_a_barrier() -> None:
    graph = _graph("few_long_rows", (1, 6000))
    # Whatever grid a plan has, the device holds one block less (other tenants keep taking SMs).
    fitted = fit(graph, 0, TINY, lambda kernel: kernel.launch.grid - 1)
    # planned at 3 of the tiny device's 4 blocks (a grid barrier's headroom), then followed down
    assert [note.split(": re-planned")[0].split(", ")[-1] for note in fitted.replans] == [
        "the device holds 2 at once",
        "the device holds 1 at once",
    ]
    assert [(k.launch.grid, k.grid_barrier) for k in fitted.kernels] == [(1, False)]
    _check_on_sim(graph, fitted.options)


def test_re_planning_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchfleet.compiler.targets.cuda import coresidency

    monkeypatch.setattr(coresidency, "MAX_REPLANS", 1)
    graph = _graph("few_long_rows", (1, 6000))
    with pytest.raises(CoresidencyError, match="no plan fits the device at once") as err:
        fit(graph, 0, TINY, lambda kernel: kernel.launch.grid - 1)
    assert str(err.value).count("re-planned with at most") == 2
