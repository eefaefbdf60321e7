"""gpu_executable: a cluster compiled for the TF GPU op without a GPU (NVRTC cubin, launch plan, launch
library), its files content-addressed, its attributes those of its plan; a prebuilt launch library is
used as given (a pod has no C compiler)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cuda.gpu_executable import GpuCompileError, compile_gpu
from stitchfleet.compiler.targets.cuda.nvrtc import Nvrtc, find_nvrtc


@pytest.fixture(scope="module")
def nvrtc() -> Nvrtc:
    found = find_nvrtc()
    if found is None:
        pytest.skip("no libnvrtc: install the dev extra")
    return found


def _softmax() -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", (16, 700))
    e = b.exp(b.sub(x, b.broadcast_to(b.reduce_max(x, (1,), keepdims=True), (16, 700))))
    b.output("y", b.div(e, b.broadcast_to(b.reduce_sum(e, (1,), keepdims=True), (16, 700))))
    return b.build()


def test_a_cluster_compiles_into_files_and_attributes(nvrtc: Nvrtc, tmp_path: Path) -> None:
    graph = _softmax()
    plan = plan_cluster(graph, 3, PlanOptions(device="h200"))
    first = compile_gpu(graph, plan, "sm_90", tmp_path, nvrtc=nvrtc)
    again = compile_gpu(graph, plan, "sm_90", tmp_path, nvrtc=nvrtc)
    assert first.module_path == again.module_path and first.module_path.is_file()
    assert len(list((tmp_path / "gpu_modules").iterdir())) == 1
    attrs = first.attrs()
    assert attrs["kernels"] == [k.name for k in first.plan.kernels] and attrs["layout"] == list(first.plan.spec)
    assert attrs["launcher"] == str(first.launcher_path) and first.launcher_path.is_file()
    assert first.output_shapes == [[16, 700]] and first.passthrough == (-1,)
    for name in attrs["kernels"]:
        assert name.encode() in first.module_path.read_bytes()
    other = compile_gpu(graph, plan, "sm_80", tmp_path, nvrtc=nvrtc)
    assert other.module_path != first.module_path and other.symbol != first.symbol


def test_a_prebuilt_launch_library_is_used_as_given(nvrtc: Nvrtc, tmp_path: Path) -> None:
    graph = _softmax()
    prebuilt = tmp_path / "ops" / "launch-prebuilt.so"
    done = compile_gpu(graph, plan_cluster(graph, 0, PlanOptions()), "sm_90", tmp_path, nvrtc=nvrtc, launcher=prebuilt)
    assert done.launcher_path == prebuilt and not (tmp_path / "launch").exists()


def test_nvrtc_errors_are_compile_errors(nvrtc: Nvrtc, tmp_path: Path) -> None:
    graph = _softmax()
    with pytest.raises(GpuCompileError, match=r"NVRTC: .*cannot compile for sm_1 "):
        compile_gpu(graph, plan_cluster(graph, 0, PlanOptions()), "sm_1", tmp_path, nvrtc=nvrtc)


def _few_long_rows() -> Graph:
    from benchmarks.suite import build_case
    from stitchfleet.compiler.scope import find_clusters
    from stitchfleet.compiler.subgraph import extract

    whole = build_case("few_long_rows", (1, 6000), "f32")
    (cluster,) = find_clusters(whole, 8).clusters
    return extract(whole, cluster.nodes)


def test_a_grid_the_device_cannot_hold_is_replanned_or_refused(nvrtc: Nvrtc, tmp_path: Path) -> None:
    graph = _few_long_rows()
    plan = plan_cluster(graph, 0, PlanOptions(device="tiny"))
    planned = compile_gpu(graph, plan, "sm_90", tmp_path, nvrtc=nvrtc)
    (kernel,) = planned.plan.kernels
    assert kernel.grid_barrier and kernel.launch.grid > 1
    # A device that holds one block less than any grid (other tenants): re-planned down to one block.
    fitted = compile_gpu(graph, plan, "sm_90", tmp_path, nvrtc=nvrtc, holds=lambda k: k.launch.grid - 1)
    assert [(k.launch.grid, k.grid_barrier) for k in fitted.plan.kernels] == [(1, False)]
    assert fitted.module_path != planned.module_path
    same = compile_gpu(graph, plan, "sm_90", tmp_path, nvrtc=nvrtc, holds=lambda k: k.launch.grid)
    assert same.plan.spec == planned.plan.spec  # it fits: the plan is left as it was
    with pytest.raises(GpuCompileError, match="does not fit on one SM at all"):
        compile_gpu(graph, plan, "sm_90", tmp_path, nvrtc=nvrtc, holds=lambda k: 0)
