"""The GPU time model: bytes, launches and barriers counted on graphs small enough to count by hand, the
report carrying modeled time per planner, and nothing outside the compiler reading it as a measurement."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stitchfleet.compiler import gpu_time, pipeline
from stitchfleet.compiler.baselines import per_op, xla_style
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op, load
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.report import CompileReport
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract

ROOT = Path(__file__).resolve().parents[2]
H100 = gpu_time.COSTS["h100"]


def _exp_times_x() -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", [1024], "f32")
    b.output("y", b.mul(b.unary(Op.EXP, x), x))
    return b.build()


def test_per_op_reads_each_operand_and_writes_each_op() -> None:
    graph = _exp_times_x()
    (cluster,) = find_clusters(graph).clusters
    traffic = gpu_time.baseline_traffic(graph, per_op(graph, cluster))
    # exp: x in, e out; mul: e and x in, y out
    assert [(k.read_bytes, k.write_bytes) for k in traffic] == [(4096, 4096), (8192, 4096)]
    modeled = gpu_time.total("per_op", 0, traffic, H100)
    assert modeled.microseconds == pytest.approx(2 * H100.launch_us + 20480 / H100.bytes_per_us, abs=1e-3)
    assert (modeled.launches, modeled.barriers, modeled.modeled) == (2, 0, True)


def test_fused_plans_move_the_cluster_io_once() -> None:
    graph = _exp_times_x()
    (cluster,) = find_clusters(graph).clusters
    (xla,) = gpu_time.baseline_traffic(graph, xla_style(graph, cluster))
    assert (xla.read_bytes, xla.write_bytes) == (4096, 4096)
    sub = extract(graph, cluster.nodes)
    (stitched,) = gpu_time.stitch_traffic(sub, plan_cluster(sub, 0, PlanOptions(device="h200")))
    assert (stitched.read_bytes, stitched.write_bytes, stitched.scratch_bytes, stitched.barriers) == (4096, 4096, 0, 0)


def test_a_split_reduction_pays_its_partials_and_barrier() -> None:
    b = GraphBuilder()
    x = b.parameter("x", [1, 1 << 20], "f32")
    b.output("s", b.mul(b.reduce_sum(x, [1]), 2.0))
    graph = b.build()
    (cluster,) = find_clusters(graph).clusters
    sub = extract(graph, cluster.nodes)
    plan = plan_cluster(sub, 0, PlanOptions(device="h200"))
    (kernel,) = gpu_time.stitch_traffic(sub, plan)
    assert kernel.read_bytes == 4 << 20 and kernel.write_bytes == 4
    assert kernel.barriers >= 1 and kernel.scratch_bytes > 0  # one row over many blocks: combined partials


def test_the_report_carries_modeled_time_for_each_planner_and_device() -> None:
    graph = load(ROOT / "benchmarks" / "workloads" / "bert_encoder" / "graph.json")
    report = pipeline.compile_graph(graph).report
    assert report is not None
    for device in ("h100", "h200"):
        totals = report.modeled_totals(device)
        assert set(totals) == {"per_op", "xla_style", "stitch"}
        assert totals["stitch"] < totals["xla_style"] < totals["per_op"]
    assert all(m.modeled for m in report.modeled)
    again = CompileReport.loads(report.dumps())
    assert again.modeled == report.modeled
    older = report.to_json()
    del older["modeled"]  # a report written before the model still reads
    assert CompileReport.from_json(older).modeled == ()
    assert "a model, not a measurement" in pipeline_table(report)


def pipeline_table(report: CompileReport) -> str:
    from stitchfleet.compiler.report import format_table

    return format_table(report)


def test_nothing_outside_the_compiler_reads_the_modeled_time() -> None:
    """Telemetry books measured savings only: the plugin and telemetry never touch the model's figures."""
    pattern = re.compile(r"\.modeled\b|modeled_totals|gpu_time")
    readers = [
        str(path.relative_to(ROOT))
        for package in ("plugin", "telemetry", "operator")
        for path in (ROOT / "stitchfleet" / package).rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert readers == []
