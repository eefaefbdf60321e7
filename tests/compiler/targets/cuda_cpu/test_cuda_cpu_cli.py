"""`stitchfleet compile --device cuda-cpu`: every cluster's rendered CUDA runs on the CPU and matches evaluate."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchfleet import cli

pytestmark = pytest.mark.cuda_cpu

SUITE = Path(__file__).resolve().parents[4] / "benchmarks" / "suite"


def test_compile_cuda_cpu_checks_each_cluster(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STITCHFLEET_CACHE_DIR", str(tmp_path))
    assert cli.main(["compile", str(SUITE / "astitch_fig7_2x128_f32.json"), "--device", "cuda-cpu"]) == 0
    out = capsys.readouterr().out
    assert "stitched CUDA text run on this CPU vs evaluate" in out
    assert "cluster 0 mul.13" in out and out.rstrip().endswith("ok")
