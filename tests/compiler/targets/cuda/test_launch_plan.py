"""launch_plan + the launch library's program runner, CPU side: specs of every cluster pass the C
checker, the C packer agrees with `pack_arguments`, scratch is laid out without overlap, bad specs and
pointers are refused by name, and a plan's module compiles with NVRTC (no GPU anywhere here).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.ir import Graph, GraphBuilder, load
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.gpu_executable import GpuCompileError, compile_gpu
from stitchfleet.compiler.targets.cuda.launch_library import LaunchError, LaunchLibrary, build, pack_arguments
from stitchfleet.compiler.targets.cuda.launch_plan import SCRATCH, SCRATCH_ALIGNMENT, LaunchPlan, plan_launches
from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc
from tests.compiler.targets.cuda.suite_kernels import SUITE, WORKLOADS


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> LaunchLibrary:
    return LaunchLibrary(build(ArtifactCache(tmp_path_factory.mktemp("launch"), suffix="so")))


def _cluster(name: str, shape: tuple[int, ...]) -> Graph:
    whole = build_case(name, shape, "f32")
    (cluster,) = find_clusters(whole, 8).clusters
    return extract(whole, cluster.nodes)


def _plan(graph: Graph, device: str = "tiny") -> LaunchPlan:
    return plan_launches(graph, lower(graph, plan_cluster(graph, 0, PlanOptions(device=device))))


def every_cluster() -> list[Graph]:
    """Every suite case's clusters and every workload cluster (what the GPU session runs)."""
    graphs: list[Graph] = []
    for path in sorted(SUITE.glob("*.json")):
        whole = load(path)
        graphs += [extract(whole, c.nodes) for c in find_clusters(whole, 8).clusters]
    return graphs + [load(path) for path in sorted(WORKLOADS.glob("*/cluster_*.json"))]


def test_every_cluster_has_a_spec_the_c_side_accepts(library: LaunchLibrary) -> None:
    graphs = every_cluster()
    assert len(graphs) >= 200
    for graph in graphs:
        plan = _plan(graph, "h200")
        library.check_spec(plan.spec)
        assert len(plan.inputs) == len(graph.parameters) and len(plan.outputs) == len(graph.outputs)


def test_the_c_packer_agrees_with_the_launch_contract(library: LaunchLibrary) -> None:
    plan = _plan(_cluster("few_long_rows", (2, 1500)))
    (kernel,) = plan.kernels
    assert kernel.grid_barrier
    inputs = [0x10000 * (i + 1) for i in range(len(plan.inputs))]
    outputs = [0x900000 + 0x10000 * j for j in range(len(plan.outputs))]
    scratch = 0x4000000
    packed = library.pack(plan.spec, 0, inputs, outputs, scratch)
    # The same pointers by buffer name, as the Python packer takes them.
    by_name = {}
    fields = list(plan.spec[11 : 11 + 2 * len(kernel.params)])
    for buf, (kind, value) in zip(kernel.params, zip(fields[::2], fields[1::2], strict=True), strict=True):
        by_name[buf.name] = (inputs, outputs, None)[kind][value] if kind != SCRATCH else scratch + value
    assert packed == pack_arguments(kernel, by_name, counter=scratch + plan.spec[4])
    assert plan.spec[4] + 4 <= plan.scratch_bytes


def test_scratch_buffers_do_not_overlap_and_are_aligned() -> None:
    plan = _plan(_cluster("few_long_rows", (2, 1500)))
    (kernel,) = plan.kernels
    fields = list(plan.spec[11 : 11 + 2 * len(kernel.params)])
    spans = sorted(
        (value, value + buf.size * buf.dtype.itemsize)
        for buf, kind, value in zip(kernel.params, fields[::2], fields[1::2], strict=True)
        if kind == SCRATCH
    )
    assert spans, "a split row keeps its partials in scratch"
    assert all(start % SCRATCH_ALIGNMENT == 0 for start, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= plan.spec[4]  # the counter comes after every buffer
    zeros_at = 11 + 2 * len(kernel.params)
    zeroed = {plan.spec[zeros_at + 1 + 2 * z] for z in range(plan.spec[zeros_at])}
    scratch_role = {b.name for b in kernel.params if b.role is ir.Role.SCRATCH}
    assert {start for start, _ in spans} >= zeroed and len(zeroed) == len(scratch_role)


def test_a_cluster_without_a_barrier_needs_no_counter(library: LaunchLibrary) -> None:
    plan = _plan(_cluster("layernorm_fwd", (24, 200)))
    assert not any(k.grid_barrier for k in plan.kernels) and plan.spec[4] == -1
    packed = library.pack(plan.spec, 0, [256] * len(plan.inputs), [512] * len(plan.outputs), 0)
    assert len(packed) == len(plan.kernels[0].params)
    checks = plan.spec[-3 * len(plan.outputs) :]
    assert [checks[3 * j] for j in range(len(plan.outputs))] == list(range(len(plan.outputs)))


@pytest.mark.parametrize(
    ("position", "value", "reason"),
    [
        (0, 2, "unknown version"),
        (4, 6, "bad counter offset"),
        (11, 9, "unknown parameter kind"),
        (12, 99, "index out of range"),
        (9, 0, "a grid barrier without a counter"),
        (-1, None, "bad checks"),
    ],
)
def test_a_bad_spec_is_refused_by_name(library: LaunchLibrary, position: int, value: int | None, reason: str) -> None:
    spec = list(_plan(_cluster("few_long_rows", (2, 1500))).spec)
    if value is None:
        spec.append(0)  # a trailing field
    elif position == 9:
        spec[4] = -1  # the kernel has a barrier, the header no counter
    else:
        spec[position] = value
    with pytest.raises(LaunchError, match=reason):
        library.check_spec(spec)


def test_a_null_or_unaligned_pointer_is_refused(library: LaunchLibrary) -> None:
    plan = _plan(_cluster("layernorm_fwd", (24, 200)))
    outputs = [512] * len(plan.outputs)
    with pytest.raises(LaunchError, match="not 16-byte aligned"):
        library.pack(plan.spec, 0, [264] * len(plan.inputs), outputs, 0)
    with pytest.raises(LaunchError, match="a null buffer"):
        library.pack(plan.spec, 0, [0] * len(plan.inputs), outputs, 0)
    with pytest.raises(LaunchError, match="no such kernel"):
        library.pack(plan.spec, 1, [256] * len(plan.inputs), outputs, 0)


def test_zero_size_tensors_alike_in_c_and_python(library: LaunchLibrary, tmp_path: Path) -> None:
    """Issue 32: the C packer refused a null pointer the Python packer accepted for a zero-size buffer. Both
    refuse a null buffer now, as "a null buffer"; a zero-size tensor never reaches either, since a kernel's
    buffers have an element each: a cluster with one gets no launch plan (the GPU compile refuses it, the
    cluster stays with TF), and the op's concrete signature sends any other shape, a zero-size batch
    included, to TF's ops before the packer."""
    plan = _plan(_cluster("layernorm_fwd", (24, 200)))
    kernel = plan.kernels[0]
    nulls = [0] * len(plan.inputs)
    with pytest.raises(LaunchError, match="a null buffer"):
        library.pack(plan.spec, 0, nulls, [512] * len(plan.outputs), 0)
    with pytest.raises(LaunchError, match="is a null buffer"):
        pack_arguments(kernel, {buf.name: 0 if buf.role is ir.Role.INPUT else 512 for buf in kernel.params})
    b = GraphBuilder()
    b.output("e", b.exp(b.parameter("x", (0, 4))))
    b.output("f", b.exp(b.parameter("y", (8, 4))))
    empty = b.build()
    with pytest.raises(ValueError, match="buffer 'in_x' has size 0"):
        plan_launches(empty, lower(empty, plan_cluster(empty, 0, PlanOptions())))
    with pytest.raises(GpuCompileError, match=r"no launch plan: .*has size 0"):
        compile_gpu(empty, plan_cluster(empty, 0, PlanOptions()), "sm_90", tmp_path)


def test_a_program_needs_the_driver(library: LaunchLibrary) -> None:
    plan = _plan(_cluster("layernorm_fwd", (24, 200)))
    with pytest.raises(LaunchError, match="not initialised"):
        library.program(b"", plan)
    with pytest.raises(LaunchError, match="not initialised"), library.primary(0):
        pass


def test_the_module_compiles_with_nvrtc_and_holds_the_flag_and_the_blame_kernels(tmp_path: Path) -> None:
    nvrtc = find_nvrtc()
    if nvrtc is None:
        pytest.skip("no libnvrtc: install the dev extra")
    plan = _plan(_cluster("few_long_rows", (2, 1500)), "h200")
    cubin = nvrtc.compile(plan.source, "sm_90", ArtifactCache(tmp_path))
    for name in (*plan.names, "sf_nonfinite_flag", "sf_blame_f32", "sf_blame_f16", "sf_blame_bf16", "sf_blame_f64"):
        assert name.encode() in cubin
