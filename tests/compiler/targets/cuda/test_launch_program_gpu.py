"""gpu tier, item 7 of issue 16: every suite case and every workload cluster through the launch library
(the C program runner the TF GPU op calls) on a real GPU, against `evaluate`, without TensorFlow.

Each cluster is planned for the H200 profile, its module compiled with NVRTC for the device's arch
(all modules first, in parallel threads: NVRTC releases the GIL), loaded with `sf_program_create`
(co-residency of grid-barrier kernels checked with the compiled kernels' real occupancy; a plan that
does not fit is re-planned with `coresidency.fit`) and run twice on a pycuda stream with one scratch
allocation (the second run shows barrier counters and partials are reset per launch). The non-finite
flag, read without a sync, must stay clear where the reference is finite. Skipped without a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, load
from stitchfleet.compiler.lower import Lowered, lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.launch_library import LaunchError, LaunchLibrary, build
from stitchfleet.compiler.targets.cuda.launch_plan import LaunchPlan, plan_launches
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.tolerance import check_outputs
from tests.compiler.targets.cuda.suite_kernels import SUITE, WORKLOADS

pytestmark = pytest.mark.gpu
FILES = sorted(SUITE.glob("*.json")) + sorted(WORKLOADS.glob("*/cluster_*.json"))
OPTIONS = PlanOptions(device="h200")


def clusters_of(path: Path) -> list[tuple[int, Graph]]:
    """(cluster index, cluster graph) of a suite case, or the one cluster of a workload cluster file."""
    whole = load(path)
    if path.name.startswith("cluster_"):
        return [(0, whole)]
    return [(i, extract(whole, c.nodes)) for i, c in enumerate(find_clusters(whole, 8).clusters)]


@dataclasses.dataclass
class Gpu:
    drv: Any
    library: LaunchLibrary
    nvrtc: Any
    arch: str
    sms: int
    cache: ArtifactCache
    stream: Any


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> Gpu:
    import pycuda.autoprimaryctx  # noqa: F401  (the primary context: the one TF, torch and JAX use)
    import pycuda.driver as drv

    from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc

    library = LaunchLibrary(build(ArtifactCache(tmp_path_factory.mktemp("launch"), suffix="so")))
    library.init()
    info, nvrtc = library.device(), find_nvrtc()
    assert nvrtc is not None, "no NVRTC on the GPU machine"
    cache = ArtifactCache(tmp_path_factory.mktemp("cubins"))
    sources = [plan_launches(g, lower(g, plan_cluster(g, i, OPTIONS))).source for p in FILES for i, g in clusters_of(p)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda source: nvrtc.compile(source, info.arch, cache), sources))
    return Gpu(drv, library, nvrtc, info.arch, info.sms, cache, drv.Stream())


def _holds(gpu: Gpu) -> Callable[[CudaKernel], int]:
    def holds(kernel: CudaKernel) -> int:
        function = gpu.library.function(gpu.library.load(gpu.nvrtc.compile(kernel.source, gpu.arch, gpu.cache)), kernel)
        return gpu.library.occupancy(function, kernel) * gpu.sms

    return holds


def _program(gpu: Gpu, graph: Graph, index: int) -> tuple[Lowered, LaunchPlan, Any]:
    """The cluster loaded for this device: as planned, or re-planned when a grid cannot be co-resident."""
    from stitchfleet.compiler.targets.cuda.coresidency import fit

    lowered = lower(graph, plan_cluster(graph, index, OPTIONS))
    plan = plan_launches(graph, lowered)
    try:
        return lowered, plan, _load(gpu, plan)
    except LaunchError as err:
        if "grid barrier" not in str(err):
            raise
    fitted = fit(graph, index, OPTIONS, _holds(gpu))
    lowered = lower(graph, plan_cluster(graph, index, fitted.options))
    plan = plan_launches(graph, lowered)
    return lowered, plan, _load(gpu, plan)


def _load(gpu: Gpu, plan: LaunchPlan) -> Any:
    """The plan's module loaded in the context of the tier's stream, as the TF op loads it on TF's."""
    return gpu.library.program(gpu.nvrtc.compile(plan.source, gpu.arch, gpu.cache), plan, int(gpu.stream.handle))


def _run(gpu: Gpu, graph: Graph, index: int) -> None:
    from stitchfleet.compiler.targets.cuda.device_arrays import device_dtype, from_device, to_device
    from stitchfleet.compiler.targets.sim.interpreter import buffer_layout

    drv = gpu.drv
    lowered, plan, program = _program(gpu, graph, index)
    layout, by_param = buffer_layout(lowered.kernels), dict(lowered.inputs)
    inputs = random_inputs(graph, 0)
    inputs_on = []
    for name in plan.inputs:
        buf = layout.get(by_param.get(name, ""))
        host = to_device(buf, inputs[name]) if buf is not None else np.ascontiguousarray(inputs[name])
        inputs_on.append(drv.to_device(host) if host.nbytes else drv.mem_alloc(16))
    outputs_on, out_bufs = [], dict(lowered.outputs)
    for name, source, repeat in zip(plan.outputs, plan.passthrough, plan.repeats, strict=True):
        buf = layout.get(out_bufs[name])
        if source >= 0 or repeat >= 0:  # an input passed through; an earlier output's buffer (its value, stored once)
            outputs_on.append(inputs_on[source] if source >= 0 else outputs_on[repeat])
            continue
        outputs_on.append(drv.mem_alloc(max(buf.size * buf.dtype.itemsize, 16)))
    scratch = drv.mem_alloc(plan.scratch_bytes) if plan.scratch_bytes else None
    pointers = ([int(a) for a in inputs_on], [int(a) for a in outputs_on], int(scratch) if scratch else 0)
    want = evaluate(graph, inputs)
    for _ in range(2):  # the second run on the same scratch: counters and partials start from zero again
        program.run(*pointers, int(gpu.stream.handle))
        gpu.stream.synchronize()
        got = {}
        for name, memory, source in zip(plan.outputs, outputs_on, plan.passthrough, strict=True):
            if source >= 0:
                got[name] = inputs[plan.inputs[source]]
                continue
            buf = layout[out_bufs[name]]
            raw = np.empty(buf.size, device_dtype(buf.dtype))
            drv.memcpy_dtoh(raw, memory)
            got[name] = from_device(buf, raw).reshape(graph.node(dict(graph.outputs)[name]).shape)
        output_checks = check_outputs(got, want, evaluate(graph, inputs, "float64"))
        assert all(v.ok for v in output_checks.values()), {k: v.reason for k, v in output_checks.items() if not v.ok}
    finite = all(np.isfinite(np.asarray(v, np.float64)).all() for v in want.values())
    noted, blamed = program.flags()  # the kernels' own note, read without a sync (the stream is idle here)
    assert not finite or noted == 0, "the non-finite flag is set although every output is finite"
    assert blamed == 0  # nothing was judged
    program.close()


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_cluster_through_the_launch_library_matches_evaluate(gpu: Gpu, path: Path) -> None:
    for index, graph in clusters_of(path):
        _run(gpu, graph, index)
