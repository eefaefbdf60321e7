"""The stitch planner on the documented shapes: mappings, schemes, shared memory, launches, reasons."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.ir import Graph, GraphBuilder, Value
from stitchfleet.compiler.plan import (
    Combine,
    GroupKind,
    Layout,
    MappingKind,
    PlanOptions,
    Scheme,
    StitchPlan,
    plan_cluster,
)
from stitchfleet.compiler.plan.mapping import MappingError
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract


def cluster_graph(graph: Graph) -> Graph:
    (cluster,) = find_clusters(graph, 8).clusters
    return extract(graph, cluster.nodes)


def plan_case(name: str, shape: tuple[int, ...], **options: object) -> StitchPlan:
    return plan_cluster(cluster_graph(build_case(name, shape, "f32")), 0, PlanOptions(**options))  # type: ignore[arg-type]


def reasons(plan: StitchPlan, action: str) -> list[str]:
    return [c.reason for c in plan.choices if c.action == action]


def test_many_short_rows_warp_per_row_packed() -> None:
    plan = plan_case("many_short_rows", (750000, 32))
    reduce, out = plan.groups
    m = reduce.mapping
    assert (m.kind, m.rows, m.cols, m.rows_per_task, m.tasks) == (MappingKind.WARP_PER_ROW, 750000, 32, 32, 23438)
    assert "32 rows per 1024-thread block" in m.reason and "vertical packing, 89 per block" in m.reason
    assert out.mapping.kind is MappingKind.ROWWISE and out.mapping.partition == (750000, 32)
    assert [e.scheme for e in plan.edges] == [Scheme.REGIONAL]
    (launch,) = plan.launches
    assert (launch.grid, launch.block_threads, launch.grid_barriers) == (264, 1024, 0)
    assert plan.shared[0].bytes == 32 * 4


def test_few_long_rows_task_splitting() -> None:
    plan = plan_case("few_long_rows", (64, 30000), deterministic=True)
    reduce = plan.groups[0]
    m = reduce.mapping
    assert (m.kind, m.blocks_per_row, m.tasks) == (MappingKind.SPLIT_ROW, 4, 256)
    assert m.combines and m.partition is None and reduce.combine is Combine.PARTIALS
    assert plan.edges[0].scheme is Scheme.GLOBAL and "spreads a value over several blocks" in plan.edges[0].reason
    (launch,) = plan.launches
    assert launch.grid_barriers == 2 and launch.grid <= launch.max_coresident_blocks
    assert any(loop.finalize == (0,) and loop.stage == 1 for loop in plan.loops)
    assert plan.kernel_count == 1
    assert reasons(plan, "combine") == [
        "partials + finalize loop: deterministic results asked for (atomic float adds vary in order run to run)"
    ]


def test_split_mean_combines_atomically_one_grid_barrier_sooner() -> None:
    plan = plan_case("few_long_rows", (64, 30000))
    assert plan.groups[0].combine is Combine.ATOMIC and plan.groups[0].mapping.blocks_per_row == 4
    assert plan.launches[0].grid_barriers == 1 and not any(loop.finalize for loop in plan.loops)
    (why,) = reasons(plan, "combine")
    assert why.startswith("atomic add of each block's reduce_mean share") and "ready after one grid barrier" in why


@pytest.mark.parametrize(
    ("build", "grid_barrier", "why"),
    [
        (lambda b, x: b.reduce_max(x, (1,), keepdims=True), True, "reduce_max has no atomic path"),
        (lambda b, x: b.reduce_sum(x, (1,), keepdims=True), False, "one kernel per stage"),
        (lambda b, x: b.rsqrt(b.reduce_sum(x, (1,), keepdims=True)), True, "tail ops need the combined value"),
    ],
)
def test_split_reduction_keeps_partials_where_atomics_do_not_fit(
    build: Callable[[GraphBuilder, Value], Value], grid_barrier: bool, why: str
) -> None:
    b = GraphBuilder()
    x = b.parameter("x", (2, 30000))
    b.output("y", x - build(b, x))
    plan = plan_cluster(cluster_graph(b.build()), 0, PlanOptions(grid_barrier=grid_barrier))
    assert plan.groups[0].combine is Combine.PARTIALS and plan.groups[0].mapping.combines
    (reason,) = reasons(plan, "combine")
    assert reason.startswith("partials + finalize loop: ") and why in reason


@pytest.mark.parametrize(("shape", "grid", "packing"), [((128, 768), 128, ""), ((16384, 4096), 264, "63 per block")])
def test_layernorm_block_per_row_regional(shape: tuple[int, int], grid: int, packing: str) -> None:
    plan = plan_case("layernorm_fwd", shape)
    kinds = [(g.kind, g.mapping.kind) for g in plan.groups]
    assert kinds == [
        (GroupKind.REDUCE, MappingKind.BLOCK_PER_ROW),
        (GroupKind.REDUCE, MappingKind.BLOCK_PER_ROW),
        (GroupKind.OUTPUT, MappingKind.ROWWISE),
    ]
    assert all(e.scheme is Scheme.REGIONAL for e in plan.edges) and len(plan.edges) == 3
    assert any("RSQRT" in c.subject and "sub-dominant" in c.reason for c in plan.choices if c.action == "merge")
    assert plan.groups[1].tail  # rsqrt(var + eps) computed once per row
    (launch,) = plan.launches
    assert (launch.grid, launch.grid_barriers) == (grid, 0)
    assert packing in plan.groups[0].mapping.reason


def test_layernorm_backward_row_and_column_reductions_in_one_kernel() -> None:
    plan = plan_case("layernorm_bwd", (128, 768))
    layouts = [g.layout for g in plan.groups if g.kind is GroupKind.REDUCE]
    assert layouts.count(Layout.COLUMN) == 2 and layouts.count(Layout.ROW) == 2
    column = next(g for g in plan.groups if g.layout is Layout.COLUMN)
    assert column.mapping.kind is MappingKind.COLUMN_TILES and column.mapping.row_splits == 4
    assert plan.kernel_count == 1 and plan.launches[0].grid_barriers == 1
    assert reasons(plan, "independent")


def test_smem_overflow_demotes_regional_to_global() -> None:
    fits = plan_case("layernorm_fwd", (128, 768))
    # two f32 row values (4 B each, at offsets 0 and 16), then 32 warps x 4 B of f32 block-reduce partials
    assert (fits.launches[0].smem_bytes, fits.launches[0].scratch_offset) == (160, 32)
    plan = plan_case("layernorm_fwd", (128, 768), smem_limit=140)
    assert all(e.scheme is Scheme.GLOBAL for e in plan.edges)
    demotions = reasons(plan, "demote")
    assert sum("exceeds the 140 B limit" in d for d in demotions) == 2
    assert sum("only ready after a grid barrier" in d for d in demotions) == 1
    assert plan.shared == () and plan.launches[0].grid_barriers == 2 and plan.kernel_count == 1


def test_partitions_differ_global_and_tiny_wave() -> None:
    plan = plan_case("cross_entropy_fwd", (64, 100), device="tiny")
    edge = next(e for e in plan.edges if e.consumer == 3)
    assert edge.scheme is Scheme.GLOBAL and "partitions differ" in edge.reason
    (launch,) = plan.launches
    # a grid barrier leaves an eighth of the wave free (rounded down: 3 of the tiny device's 4 blocks)
    assert launch.grid_barriers and (launch.block_threads, launch.grid, launch.max_coresident_blocks) == (128, 3, 4)
    assert plan.groups[0].mapping.rows_per_task == 4


def test_the_register_cap_is_what_the_grid_needs_resident() -> None:
    """A grid of at most one block per SM may use 64 registers a thread (1024 x 64 fill an SM's 64K), where
    a full wave of two blocks per SM allows 32: the launch bounds then stop capping a kernel at 32 registers
    that needs no second block (57 of the 73 spilling kernels of the ptxas gate were such kernels)."""
    small = plan_case("layernorm_fwd", (128, 768))
    large = plan_case("bias_gelu_fwd", (4096, 3072))
    assert [(lp.grid, lp.registers) for lp in small.launches] == [(128, 64)]
    assert large.launches[0].grid == 264 and large.launches[0].registers == 32


def test_a_grid_barrier_grid_keeps_its_headroom() -> None:
    plan = plan_case("layernorm_bwd", (4096, 4096))  # 4096 row tasks: the grid was a full wave of 264
    (launch,) = plan.launches
    sms = 132
    assert launch.grid_barriers and launch.grid == 231  # 7/8 of 2 x 132
    resident = 65536 // (launch.block_threads * launch.registers) * sms
    assert launch.grid <= resident * 7 / 8  # at the relaxed register cap too


def test_without_grid_barriers_one_kernel_per_stage() -> None:
    plan = plan_case("few_long_rows", (64, 30000), grid_barrier=False)
    assert plan.kernel_count == 3 and all(launch.grid_barriers == 0 for launch in plan.launches)
    assert any("one kernel refused: grid barriers are not allowed" in r for r in reasons(plan, "split"))


def test_forced_row_mappings() -> None:
    for kind in (MappingKind.WARP_PER_ROW, MappingKind.BLOCK_PER_ROW, MappingKind.SPLIT_ROW):
        plan = plan_case("layernorm_fwd", (128, 768), force_row_mapping=kind)
        assert plan.groups[0].mapping.kind is kind and plan.groups[0].mapping.reason.startswith("forced")
    with pytest.raises(MappingError, match="column_tiles: not a row-reduction mapping"):
        plan_case("layernorm_fwd", (128, 768), force_row_mapping=MappingKind.COLUMN_TILES)


def test_transposed_consumer_is_global() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (64, 64))
    s = b.reduce_sum(x, (1,), keepdims=True)
    b.output("y", b.transpose(x - s, (1, 0)) * 2.0)
    plan = plan_cluster(cluster_graph(b.build()), 0, PlanOptions(device="tiny"))
    edge = plan.edges[0]
    assert edge.scheme is Scheme.GLOBAL and plan.groups[1].mapping.kind is MappingKind.ELEMENTWISE


def test_shared_buffers_reuse_space_by_liveness() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (64, 256))
    m = b.reduce_sum(x, (1,), keepdims=True)
    for _ in range(2):
        m = b.reduce_sum(x * m, (1,), keepdims=True)
    b.output("y", x * m)
    plan = plan_cluster(cluster_graph(b.build()), 0, PlanOptions(device="tiny"))
    assert all(e.scheme is Scheme.REGIONAL for e in plan.edges)
    offsets = [(s.first, s.last, s.offset) for s in sorted(plan.shared, key=lambda s: s.first)]
    assert offsets == [(0, 1, 0), (1, 2, 16), (2, 3, 0)]


def test_expensive_broadcast_op_is_a_dominant() -> None:
    b = GraphBuilder()
    x, v = b.parameter("x", (32, 64)), b.parameter("v", (32, 1))
    b.output("y", x * b.rsqrt(v))
    plan = plan_cluster(cluster_graph(b.build()), 0, PlanOptions(device="tiny"))
    assert [g.kind for g in plan.groups] == [GroupKind.ELEMENTWISE, GroupKind.OUTPUT]
    assert plan.edges[0].scheme is Scheme.REGIONAL
    assert plan.to_json()["groups"][0]["kind"] == "elementwise"  # type: ignore[index]
