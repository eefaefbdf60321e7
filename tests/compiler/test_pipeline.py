"""Pipeline, CompileReport round trip, dumps, and the `stitchfleet compile` command."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stitchfleet import cli, settings
from stitchfleet.compiler import pipeline
from stitchfleet.compiler.decision import Decision
from stitchfleet.compiler.ir import load
from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.report import CompileReport, ReportFormatError, format_table

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "suite"
LAYERNORM = SUITE / "layernorm_fwd_128x768_f32.json"


def test_stages_are_listed_once_in_data_flow_order() -> None:
    names = [s.artifact for s in pipeline.STAGES]
    assert names == [
        "clusters",
        "op_clusters",
        "cluster_graphs",
        "baseline_plans",
        "stitch",
        "kernels",
        "sources",
        "report",
    ]
    assert all(s.produce.__name__ == s.artifact for s in pipeline.STAGES)


def test_report_contents_and_json_round_trip() -> None:
    art = pipeline.compile_graph(load(LAYERNORM))
    report = art.report
    assert report is not None
    assert report.totals() == {"per_op": 9, "xla_style": 3, "stitch": 1}
    assert [t.stage for t in report.timings] == [s.artifact for s in pipeline.STAGES][:-1]
    assert report.clusters[0].fingerprint == pipeline.ir.fingerprint(art.cluster_graphs[0])
    again = CompileReport.loads(report.dumps())
    assert again == report
    assert "per_op" in format_table(report)
    with pytest.raises(ReportFormatError, match="not valid JSON"):
        CompileReport.loads(report.dumps()[:40])
    with pytest.raises(ReportFormatError, match="not a stitchfleet-compile-report"):
        CompileReport.from_json({"format": "other"})


# The dump files of a compile that asks for every stage (kernel IR and sources included), in order.
DUMPS = (
    "00_graph.json",
    "01_clusters.json",
    "02_op_clusters.json",
    "03_cluster_graphs.json",
    "04_baseline_plans.json",
    "05_stitch.json",
    "06_kernels.json",
    "07_sources.json",
    "08_report.json",
)


def test_artifacts_are_dumped(tmp_path: Path) -> None:
    pipeline.compile_graph(load(LAYERNORM), pipeline.Options(dump_dir=tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == list(DUMPS)
    assert json.loads((tmp_path / "08_report.json").read_text())["format"] == "stitchfleet-compile-report"


def test_kernel_ir_and_sources_are_stages_when_asked(tmp_path: Path) -> None:
    asked = pipeline.Options(dump_dir=tmp_path, kernels=True, sources=pipeline.SOURCE_TARGETS)
    art = pipeline.compile_graph(load(LAYERNORM), asked)
    (plan,), (lowered,) = art.stitch, art.kernels
    assert isinstance(plan, StitchPlan) and isinstance(lowered, Lowered)
    assert len(lowered.kernels) == plan.kernel_count
    cpu, cuda = art.sources
    assert isinstance(cpu, pipeline.RenderedSource) and isinstance(cuda, pipeline.RenderedSource)
    assert (cpu.target, cuda.target) == ("cpu", "cuda")
    assert "int stitch_cluster0(" in cpu.text and all(k.name in cuda.text for k in lowered.kernels)
    dumped = json.loads((tmp_path / "06_kernels.json").read_text())
    assert dumped[0]["kernels"][0].startswith(f"kernel {lowered.kernels[0].name}(")
    assert json.loads((tmp_path / "07_sources.json").read_text())[1]["text"] == cuda.text
    plain = pipeline.compile_graph(load(LAYERNORM))  # not asked: a job's setup does not pay for them
    assert plain.kernels == () and plain.sources == ()
    with pytest.raises(ValueError, match="kernel IR"):
        pipeline.Options(sources=("cuda",))


def test_a_cluster_not_lowered_keeps_its_reason_and_its_cpu_source() -> None:
    """The cpu C comes from the plan: a cluster whose kernel IR failed still gets it; cuda passes the reason on."""
    asked = pipeline.Options(kernels=True, sources=pipeline.SOURCE_TARGETS)
    art = pipeline.compile_graph(load(LAYERNORM), asked)
    failed = Decision("kernels", "refuse", "cluster 0", "not lowered: for this test")
    art = dataclasses.replace(art, kernels=(failed,))
    cpu, cuda = pipeline.sources(art, asked)
    assert isinstance(cpu, pipeline.RenderedSource) and cuda == failed
    art = dataclasses.replace(art, sources=(cpu, cuda))
    assert pipeline.report(art, asked).decisions.count(failed) == 1


def test_cli_compile_table_and_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STITCHFLEET_DUMP_DIR", raising=False)
    settings.reset()
    assert cli.main(["compile", str(SUITE / "astitch_fig7_2x128_f32.json")]) == 0
    out = capsys.readouterr().out
    assert "clusters: 1" in out
    assert "xla_style" in out
    assert "graph input" in out
    assert cli.main(["compile", str(LAYERNORM), "--report", "json"]) == 0
    report = CompileReport.loads(capsys.readouterr().out)
    assert report.totals()["xla_style"] == 3


def test_cli_compile_reference_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(SUITE / "softmax_fwd_4096x256_f16.json"), "--device", "reference"]) == 0
    assert "y " in capsys.readouterr().out


def test_cli_compile_dumps_where_the_setting_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STITCHFLEET_DUMP_DIR", str(tmp_path / "dump"))
    settings.reset()
    try:
        assert cli.main(["compile", str(LAYERNORM)]) == 0
    finally:
        settings.reset()
    assert (tmp_path / "dump" / "08_report.json").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compile", str(LAYERNORM), "--device", "cuda"], "is not available (devices: reference, cpu, cuda-cpu, sim)"),
        (["compile", "/nonexistent/g.json"], "cannot read /nonexistent/g.json"),
    ],
)
def test_cli_compile_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_cli_compile_bad_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(LAYERNORM.read_text()[:100])
    assert cli.main(["compile", str(bad)]) == cli.EXIT_USAGE
    assert "truncated" in capsys.readouterr().err


def test_a_report_without_the_gpu_time_model_differs_in_nothing_else() -> None:
    """A job's hook reads no modeled GPU time (issue 29's setup cost: ~5-10 ms of the demo's setup): without it the
    report is the same, its `modeled` empty."""
    graph = load(LAYERNORM)
    full, lean = (pipeline.compile_graph(graph, pipeline.Options(modeled=m)).report for m in (True, False))
    assert full is not None and lean is not None and full.modeled and lean.modeled == ()
    assert dataclasses.replace(full, modeled=(), timings=()) == dataclasses.replace(lean, timings=())
