"""scripts/gpu_session.sh on the CPU: its options, and the dry run (the steps in order, the runner's dry run
planning and NVRTC-compiling a case and writing its files under $OUT, the three sanitizer runs named).
What it does on a GPU is not run here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_session.sh"


def session(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_help_lists_the_options(tmp_path: Path) -> None:
    done = session(tmp_path, "--help")
    assert done.returncode == 0
    for option in ("--dry-run", "--limit", "--bench-args", "--no-bench"):
        assert option in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown argument: --bogus"),
        (["--limit", "ten"], "--limit must be whole seconds, got 'ten'"),
        (["--limit", "60"], "--limit 60 is too short"),
        (["--limit"], "--limit needs a number of seconds"),
        (["--bench-args"], "--bench-args needs a value"),
    ],
)
def test_bad_options_exit_2_and_say_why(tmp_path: Path, args: list[str], message: str) -> None:
    done = session(tmp_path, *args)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "gpu_session.log").exists()  # refused before anything ran


@pytest.mark.slow
def test_the_dry_run_walks_every_step_and_leaves_its_files(tmp_path: Path) -> None:
    done = session(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    log = (tmp_path / "gpu_session.log").read_text()
    steps = [line.split(":")[0] for line in log.splitlines() if line.startswith("== step")]
    assert steps == ["== step 1", "== step 2", "== step 3", "== step 3", "== step 3"]
    assert "bench_gpu_launch.py" in log and "--time-budget" in log and "pycuda" not in log
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert f"compute-sanitizer --tool {tool}" in log
    assert "1 kernel(s), module" in log  # a case planned and compiled by NVRTC
    written = sorted(p.suffix for p in (tmp_path / "results").iterdir())
    assert written == [".json", ".md"] and "dry run ok" in log


@pytest.mark.slow
def test_runner_options_are_checked_by_the_dry_run(tmp_path: Path) -> None:
    done = session(tmp_path, "--dry-run", "--bench-args", "--no-such-option")
    assert done.returncode != 0 and "unrecognized arguments: --no-such-option" in done.stdout
    checks_only = session(tmp_path / "tier", "--dry-run", "--no-bench")
    assert checks_only.returncode == 0 and "--check-only --out" in checks_only.stdout
