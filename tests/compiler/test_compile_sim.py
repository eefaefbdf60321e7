"""`stitchfleet compile --device sim`: every cluster's stitched kernels run on the sim and match evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stitchfleet import cli
from stitchfleet.compiler import compile_command
from stitchfleet.compiler.ir import GraphBuilder, save

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "suite"


def test_compile_sim_checks_each_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(SUITE / "astitch_fig7_2x128_f32.json"), "--device", "sim"]) == 0
    out = capsys.readouterr().out
    assert "stitched kernels on the sim vs evaluate" in out
    assert "cluster 0 mul.13                   1 kernel(s)" in out and out.rstrip().endswith("ok")


def test_compile_sim_with_an_opaque_op_between_clusters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = GraphBuilder()
    x, w = b.parameter("x", (4, 40)), b.parameter("w", (40, 40))
    h = b.opaque("MatMul", (b.exp(x) * 0.5, w), (4, 40), "f32", "compute-intensive")
    b.output("y", h - b.reduce_max(h, (1,), keepdims=True))
    path = save(b.build(), tmp_path / "g.json")
    assert compile_command.run(str(path), "table", "sim", 8, None) == 0
    out = capsys.readouterr().out
    assert out.count("kernel(s)") == 2 and "FAIL" not in out


def test_compile_sim_runs_a_cluster_that_reads_a_tensor_constant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was refused ("tensor constants are not lowered"); the constant is now a cluster input."""
    b = GraphBuilder()
    x = b.parameter("x", (2, 3))
    b.output("y", b.exp(x) + b.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    path = save(b.build(), tmp_path / "g.json")
    assert compile_command.run(str(path), "table", "sim", 8, None) == 0
    assert "not lowered" not in capsys.readouterr().out


def _with_random_draw(tmp_path: Path) -> Path:
    """A random draw (opaque to evaluate) feeds a cluster: whole-graph evaluation cannot run this graph."""
    b = GraphBuilder()
    x = b.parameter("x", (4, 40))
    noise = b.opaque("StatelessRandomUniformV2", (), (4, 40), "f32", "unsupported op StatelessRandomUniformV2")
    y = b.exp(x) * noise
    b.output("y", y - b.reduce_max(y, (1,), keepdims=True))
    return save(b.build(), tmp_path / "g.json")


@pytest.mark.parametrize("device", ["sim", "cpu"])
def test_compile_checks_clusters_on_their_own_inputs(
    device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was 'reference evaluation failed: ... StatelessRandomUniformV2 (OPAQUE)' (whole-graph evaluation)."""
    assert compile_command.run(str(_with_random_draw(tmp_path)), "table", device, 8, None, cache_dir=tmp_path) == 0
    out = capsys.readouterr().out
    assert "random inputs of its own" in out and "kernel(s)" in out and "FAIL" not in out


def test_compile_json_prints_one_document_with_coverage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert compile_command.run(str(_with_random_draw(tmp_path)), "json", "sim", 8, None) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # fails on a table or check lines after the JSON
    assert "kernel(s)" in captured.err
    coverage = doc["coverage"]
    # exp, mul, reduce_max, its broadcast, sub: all stitched; the random draw is no memory-intensive op
    assert coverage["memory_intensive"] == coverage["stitched"] >= 4
    assert coverage["share"] == 1.0


def test_coverage_counts_an_unsupported_op_as_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 40))
    bn = b.opaque("FusedBatchNormV3", (b.exp(x) * 2.0,), (4, 40), "f32", "unsupported op FusedBatchNormV3")
    b.output("y", b.tanh(bn) + 1.0)
    path = save(b.build(), tmp_path / "g.json")
    assert compile_command.run(str(path), "table", None, 8, None) == 0
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("coverage: "))
    assert "FusedBatchNormV3: unsupported op FusedBatchNormV3 (1)" in line
    stitched, total = line.split()[1].split("/")
    assert int(stitched) < int(total)
