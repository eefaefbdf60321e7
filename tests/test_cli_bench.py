"""cli `bench`: the gpu and cpu harnesses behind `stitchfleet bench KIND`, their --help, files and refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness.frameworks import available
from stitchfleet import cli

ROOT = Path(__file__).resolve().parents[1]


def test_bench_help_lists_the_harnesses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["bench", "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert "gpu" in out and "cpu" in out and "torch.compile" in out and "TensorFlow" in out


def test_bench_without_a_kind_prints_usage_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench"]) == cli.EXIT_USAGE
    assert "usage: stitchfleet bench" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kind", "options"),
    [("gpu", ("--dry-run", "--cases", "--max-bytes", "--time-budget", "--out")), ("cpu", ("--only", "--scale"))],
)
def test_kind_help_lists_the_harness_options(kind: str, options: tuple[str, ...], capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["bench", kind, "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: stitchfleet bench {kind}" in out
    assert all(option in out for option in options)


def test_gpu_dry_run_writes_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "gpu", "--dry-run", "--cases", "softmax_fwd", "--runs", "2", "--warmup", "1"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[1/2" in out and "[2/2" in out  # one progress line per case
    assert "stitch us" in out and "geomean: x per_op" in out  # the summary table
    (json_path,) = tmp_path.glob("cpu-dryrun-*.json")
    assert f"wrote {json_path}" in out
    run = json.loads(json_path.read_text())
    assert [c["case"] for c in run["cases"]] == ["softmax_fwd_8x64_f32", "softmax_fwd_8x64_f16"]
    for case in run["cases"]:
        stitch = case["variants"]["stitch"]
        assert stitch["kernels"] == 1 and stitch["samples"] == 2 and stitch["median_s"] > 0
        assert case["checks"]["stitch"]["ok"] and case["checks"]["per_op"]["ok"]
    assert run["options"]["runs"] == 2 and run["clock"].startswith("wall clock")
    markdown = json_path.with_suffix(".md").read_text()
    assert "| softmax_fwd_8x64_f32 | 8x64 | f32 |" in markdown and "| softmax_fwd_8x64_f16 | 8x64 | f16 |" in markdown


@pytest.mark.skipif(available("pycuda"), reason="pycuda is installed here: the refusal needs a machine without it")
def test_gpu_without_pycuda_refuses_and_measures_nothing(tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "results"
    assert cli.main(["bench", "gpu", "--cases", "softmax_fwd", "--out", str(out_dir)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "no usable GPU" in err and "pycuda is not installed" in err
    assert "--dry-run" in err and '"GPU session"' in err and "benchmarks/README.md" in err
    assert not out_dir.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "0"], "--runs must be at least 1"),
        (["--max-bytes", "0"], "--max-bytes must be positive"),
        (["--no-suite"], "--no-suite leaves nothing to run"),
        (["--cases", "no_such_case"], "no case matches"),
    ],
)
def test_gpu_bad_options_are_named(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "gpu", "--dry-run", *argv]) == cli.EXIT_USAGE
    assert f"stitchfleet bench gpu: {message}" in capsys.readouterr().err


@pytest.mark.tf
def test_cpu_small_case_writes_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STITCHFLEET_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["bench", "cpu", "--only", "suite/softmax_fwd", "--scale", "0.01", "--reps", "3", "--warmup", "1"]
    assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    (json_path,) = (tmp_path / "out").glob("cpu-*.json")
    doc = json.loads(json_path.read_text())
    (row,) = doc["rows"]
    assert row["case"] == "suite/softmax_fwd_41x1024_f32#0" and row["elements"] > 41 * 1024
    assert row["cpu_ms"] > 0 and row["tf_ms"] > 0 and row["speedup"] == pytest.approx(row["tf_ms"] / row["cpu_ms"])
    assert doc["summary"]["suite"]["clusters"] == 1 and doc["reps"] == 3 and doc["options"]["scale"] == 0.01
    assert "suite/softmax_fwd_41x1024_f32#0" in out and f"wrote {json_path}" in out
    markdown = json_path.with_suffix(".md").read_text()
    assert "| suite/softmax_fwd_41x1024_f32#0 | 9 |" in markdown and "scaled to 0.01 of their rows" in markdown
    assert any((tmp_path / "cache" / "bench-cpu").iterdir())  # the stitched C went to STITCHFLEET_CACHE_DIR


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scale", "0"], "--scale must be in (0, 1], got 0"),
        (["--reps", "0"], "--reps must be at least 1"),
        (["--warmup", "0"], "--warmup must be at least 1"),
        (["--max-elements", "0"], "--max-elements must be at least 1"),
        (["--only", "no_such_cluster"], "no cluster matches"),
    ],
)
def test_cpu_bad_options_are_named(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "cpu", *argv]) == cli.EXIT_USAGE
    assert f"stitchfleet bench cpu: {message}" in capsys.readouterr().err


def _without_repository(tmp_path: Path, cwd: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The cli as the console script runs it: the package importable, no repository on sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "stitchfleet").symlink_to(ROOT / "stitchfleet")
    code = (
        f"import sys; sys.path[:] = [p for p in sys.path if p not in ('', {str(ROOT)!r})]; "
        f"from stitchfleet import cli; sys.exit(cli.main({argv!r}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_outside_the_repository_says_where_to_run(tmp_path: Path) -> None:
    result = _without_repository(tmp_path, tmp_path, ["bench", "gpu", "--dry-run"])
    assert result.returncode == cli.EXIT_USAGE, result.stderr
    assert "run it from the root of the stitchfleet repository" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_from_the_repository_root_finds_the_harness(tmp_path: Path) -> None:
    result = _without_repository(tmp_path, ROOT, ["bench", "cpu", "--help"])
    assert result.returncode == 0, result.stderr
    assert "--max-elements" in result.stdout
