"""The launch library: it builds and loads on any machine, says plainly when there is no driver,
packs a rendered kernel's arguments by the launch contract, and on a GPU launches suite kernels
(cooperatively where they have a grid barrier) that match `evaluate`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.launch_library import (
    LaunchError,
    LaunchLibrary,
    build,
    pack_arguments,
    scratch_bytes,
)
from stitchfleet.compiler.targets.cuda.render import render_kernel
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from tests.compiler.targets.cuda.suite_kernels import suite_kernels


def _have_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> LaunchLibrary:
    return LaunchLibrary(build(ArtifactCache(tmp_path_factory.mktemp("launch"), suffix="so")))


def _kernel(grid_barrier: bool) -> CudaKernel:
    kernels = [k for k in suite_kernels("tiny") if any(isinstance(s, ir.GridSync) for s in k.body) == grid_barrier]
    return render_kernel(kernels[0])


def test_the_library_builds_once_and_loads(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path, suffix="so")
    first = build(cache)
    assert first.is_file() and build(cache) == first and len(list(tmp_path.iterdir())) == 1
    LaunchLibrary(first)


@pytest.mark.skipif(_have_driver(), reason="a CUDA driver is present: the no-driver path cannot be shown")
def test_without_a_driver_init_says_so(library: LaunchLibrary) -> None:
    with pytest.raises(LaunchError, match=r"no CUDA driver: dlopen\(libcuda.so.1\) failed"):
        library.init()


def test_driver_calls_before_init_are_refused(library: LaunchLibrary) -> None:
    with pytest.raises(LaunchError, match="not initialised"):
        library.device()


def test_the_coresident_grid_is_blocks_per_sm_times_sms(library: LaunchLibrary) -> None:
    assert library.coresident_grid(3, 132) == 396
    assert library.coresident_grid(0, 132) == 0 and library.coresident_grid(2, -1) == 0


def test_arguments_follow_the_parameter_order_then_the_counter() -> None:
    kernel = _kernel(grid_barrier=True)
    pointers = {buf.name: 256 * (index + 1) for index, buf in enumerate(kernel.params)}
    packed = pack_arguments(kernel, pointers, counter=4096)
    assert packed == [*(pointers[buf.name] for buf in kernel.params), 4096]
    plain = _kernel(grid_barrier=False)
    assert pack_arguments(plain, {buf.name: 512 for buf in plain.params}) == [512] * len(plain.params)


def test_bad_arguments_are_named() -> None:
    kernel = _kernel(grid_barrier=True)
    good = {buf.name: 256 for buf in kernel.params}
    first = kernel.params[0].name
    with pytest.raises(LaunchError, match=f"no pointer for buffer\\(s\\) {first}"):
        pack_arguments(kernel, {k: v for k, v in good.items() if k != first}, counter=256)
    with pytest.raises(LaunchError, match="is not 16-byte aligned"):
        pack_arguments(kernel, {**good, first: 258}, counter=256)
    with pytest.raises(LaunchError, match="needs a counter"):
        pack_arguments(kernel, good)
    plain = _kernel(grid_barrier=False)
    with pytest.raises(LaunchError, match="takes no counter"):
        pack_arguments(plain, {buf.name: 256 for buf in plain.params}, counter=256)


def test_scratch_bytes_count_scratch_buffers_and_the_counter() -> None:
    kernel = _kernel(grid_barrier=True)
    scratch = sum(b.size * b.dtype.itemsize for b in kernel.params if b.role is ir.Role.SCRATCH)
    assert scratch_bytes(kernel) == scratch + 4


@pytest.mark.gpu
@pytest.mark.parametrize("case", [("few_long_rows", (2, 1500)), ("layernorm_fwd", (24, 200))])
def test_a_cluster_launches_and_matches_evaluate(library: LaunchLibrary, case: tuple[str, tuple[int, int]]) -> None:
    """On a GPU: a tiny-profile cluster (grid barrier: cooperative launch), NVRTC-compiled, on pycuda memory."""
    import pycuda.autoprimaryctx  # noqa: F401  (makes the primary context current, as TF and torch use it)
    import pycuda.driver as drv

    from benchmarks.suite import build_case
    from stitchfleet.compiler.evaluate import evaluate, random_inputs
    from stitchfleet.compiler.lower import lower
    from stitchfleet.compiler.plan import PlanOptions, plan_cluster
    from stitchfleet.compiler.scope import find_clusters
    from stitchfleet.compiler.subgraph import extract
    from stitchfleet.compiler.targets.cuda.device_arrays import device_dtype, from_device, to_device
    from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc
    from stitchfleet.compiler.targets.sim.interpreter import buffer_layout
    from stitchfleet.compiler.tolerance import check_outputs

    name, shape = case
    whole = build_case(name, shape, "f32")
    (cluster,) = find_clusters(whole, 8).clusters
    graph = extract(whole, cluster.nodes)
    lowered = lower(graph, plan_cluster(graph, 0, PlanOptions(device="tiny")))
    library.init()
    info, nvrtc = library.device(), find_nvrtc()
    assert nvrtc is not None
    inputs = random_inputs(graph, 0)
    layout = buffer_layout(lowered.kernels)
    by_buffer = {buf: np.asarray(inputs[param]).reshape(-1) for param, buf in lowered.inputs}
    memory = {}
    for buf_name, buf in layout.items():
        memory[buf_name] = drv.mem_alloc(max(buf.size * buf.dtype.itemsize, 16))
        if buf_name in by_buffer:
            drv.memcpy_htod(memory[buf_name], to_device(buf, by_buffer[buf_name]))
        else:
            drv.memset_d8(memory[buf_name], 0, max(buf.size * buf.dtype.itemsize, 16))
    counter = drv.mem_alloc(16)
    for kernel_ir in lowered.kernels:
        kernel = render_kernel(kernel_ir)
        function = library.function(library.load(nvrtc.compile(kernel.source, info.arch)), kernel)
        assert library.occupancy(function, kernel) >= 1
        pointers = {buf.name: int(memory[buf.name]) for buf in kernel.params}
        library.launch(function, kernel, pack_arguments(kernel, pointers, int(counter) if kernel.grid_barrier else 0))
    drv.Context.synchronize()
    got = {}
    for output, buf_name in lowered.outputs:
        buf = layout[buf_name]
        raw = np.empty(buf.size, device_dtype(buf.dtype))
        drv.memcpy_dtoh(raw, memory[buf_name])
        got[output] = from_device(buf, raw).reshape(graph.node(dict(graph.outputs)[output]).shape)
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {k: v.reason for k, v in output_checks.items() if not v.ok}
