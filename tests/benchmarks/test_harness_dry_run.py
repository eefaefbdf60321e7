"""The harness plumbing on the CPU: scripts/bench_gpu.py --dry-run, interleaved timing, result files."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import pytest

from benchmarks.harness import results
from benchmarks.harness.frameworks import available
from benchmarks.harness.timing import Variant, measure

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_gpu

HAS_JAX, HAS_TORCH = available("jax"), available("torch")


COSTS: dict[str, float] = {}  # a variant's cost on the fake clock below


def _sleeper(name: str, seconds: float, log: list[str]) -> Variant:
    """A variant that costs `seconds` on the test's clock: no real sleeping, so a busy machine
    cannot change the calibration or the order of the medians (regression: it flaked under load)."""
    COSTS[name] = seconds

    def call() -> object:
        log.append(name)
        return None

    return Variant(name, call, lambda _: None, dict, 1)


def _wall(variant: Variant, reps: int) -> float:
    for _ in range(reps):
        variant.call()
    return COSTS[variant.name]


def test_measure_warms_up_interleaves_and_takes_medians() -> None:
    log: list[str] = []
    variants = [_sleeper("a", 0.001, log), _sleeper("b", 0.003, log)]
    timings = measure(_wall, variants, runs=4, warmup=2, target_s=0.002)
    assert log[:4] == ["a", "a", "b", "b"]  # warm-up first, then one calibration call each
    assert timings["a"].reps == timings["b"].reps == 2 and timings["a"].samples == 4
    timed = log[6:]
    assert timed[:4] == ["a", "a", "b", "b"] and timed[4:8] == ["b", "b", "a", "a"]  # order rotates per round
    assert timings["a"].median_s < timings["b"].median_s
    with pytest.raises(ValueError, match="runs must be >= 1"):
        measure(_wall, variants, runs=0, warmup=0, target_s=0.001)


def test_dry_run_writes_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--dry-run", "--cases", "bias_gelu_fwd_8x48_f32", "astitch", "--runs", "2", "--warmup", "1"]
    assert bench_gpu.main([*argv, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "copy bandwidth" in printed and "[1/2" in printed and "[2/2" in printed
    (json_path,) = tmp_path.glob("cpu-dryrun-*.json")
    assert json_path.name.endswith(f"_{dt.date.today().isoformat()}.json")
    run = json.loads(json_path.read_text())
    assert run["clock"].startswith("wall clock") and run["copy"]["gbps"] > 0
    assert [c["case"] for c in run["cases"]] == ["bias_gelu_fwd_8x48_f32", "astitch_fig7_2x128_f32"]
    for case in run["cases"]:
        figures = case["variants"]
        assert figures["stitch"]["kernels"] == 1 and figures["per_op"]["kernels"] > 1
        assert figures["stitch"]["samples"] == 2 and figures["stitch"]["gbps"] > 0
        assert figures["stitch"]["speedup_vs_per_op"] > 0
        assert all(check["ok"] and check["reference"] == "evaluate" for check in case["checks"].values())
        assert ("jax_jit" in figures) == HAS_JAX and ("torch_compile" in figures) == HAS_TORCH
        if not HAS_JAX:
            assert case["not_run"]["jax_jit"] == "not installed"
    markdown = json_path.with_suffix(".md").read_text()
    assert "| bias_gelu_fwd_8x48_f32 | 8x48 | f32 |" in markdown and "1 / 6 |" in markdown


def test_dry_run_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_gpu.main(["--dry-run", "--cases", "no_such_case"]) == 2
    assert "no case matches" in capsys.readouterr().err
    assert bench_gpu.main(["--dry-run", "--runs", "0"]) == 2
    assert "--runs must be at least 1" in capsys.readouterr().err


def test_failed_check_is_reported_and_not_timed(tmp_path: Path) -> None:
    run = {
        "device": "NVIDIA H200",
        "clock": "CUDA events",
        "options": {"runs": 20, "warmup": 3},
        "copy": {"gbps": 4300.0},
        "cases": [
            {
                "case": "softmax_fwd_4096x256_f32",
                "shape": [4096, 256],
                "dtype": "f32",
                "io_bytes": 8388608,
                "checks": {"stitch": {"ok": False, "reason": "y: error 0.1 exceeds 8 x native error"}},
                "skipped": "our stitched program failed its correctness check or could not be built: not timed",
            }
        ],
    }
    json_path, md_path = results.write(run, tmp_path, dt.date(2026, 11, 21))
    assert json_path.name == "nvidia-h200_2026-11-21.json"
    text = md_path.read_text()
    assert "not timed" in text and "- softmax_fwd_4096x256_f32 stitch: y: error 0.1" in text


def test_time_budget_leaves_later_cases_out_and_says_so(tmp_path: Path) -> None:
    assert bench_gpu.main(["--dry-run", "--cases", "softmax", "--time-budget", "0", "--out", str(tmp_path)]) == 0
    run = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert len(run["cases"]) == 5 and all(c["skipped"] == "time budget spent" for c in run["cases"])
    assert "not timed: time budget spent" in next(tmp_path.glob("*.md")).read_text()


def test_suite_order_covers_every_case_before_larger_shapes() -> None:
    from benchmarks.harness.cases import suite_cases
    from benchmarks.suite import CASES

    names = [c.name for c in suite_cases()]
    first_round = names[: sum(len(c.dtypes) for c in CASES.values())]
    assert {n.split("_")[0] for n in first_round} == {n.split("_")[0] for n in CASES}
    assert first_round[0] == "layernorm_fwd_128x768_f32" and "layernorm_fwd_4096x1024_f32" not in first_round
