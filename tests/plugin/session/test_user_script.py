"""An ordinary TF1 script runs to the end under the shim, exactly as without it, and only its
training steps are stitched, counted and timed (side runs, evals with other feeds are untouched).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stitchfleet.boot import installer

SCRIPT = Path(__file__).resolve().parents[1] / "user_script.py"
STEPS = 60


def _run(tmp_path: Path, enabled: str) -> dict[str, str]:
    shim = tmp_path / "opt"
    installer.install(shim)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STITCHFLEET_", "PYTHONPATH"))}
    env.update(
        PYTHONPATH=str(shim / "shim"),
        STITCHFLEET_ENABLED=enabled,
        STITCHFLEET_STATE_DIR=str(tmp_path / "state"),
        STITCHFLEET_JOB_UID="user-script",
        STITCHFLEET_WARMUP_STEPS="2",
        STITCHFLEET_BASELINE_STEPS="4",
        STITCHFLEET_PROBE_STEPS="3",
        STITCHFLEET_WINDOW_STEPS="10",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(STEPS)], env=env, capture_output=True, text=True, timeout=400, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)


@pytest.mark.tf
@pytest.mark.slow
def test_a_user_script_runs_to_the_end_and_only_training_steps_count(tmp_path: Path) -> None:
    on = _run(tmp_path / "on", "1")
    off = _run(tmp_path / "off", "0")
    assert (on["trained"], on["evals"], on["final-step"]) == (str(STEPS), "6", str(STEPS))
    assert on["losses"].split()[:3] == off["losses"].split()[:3]  # warmup and baseline run TF's own ops
    database = tmp_path / "on" / "state" / "telemetry.db"
    with sqlite3.connect(database) as connection:
        modes = dict(connection.execute("SELECT mode, SUM(iterations) FROM step_windows GROUP BY mode").fetchall())
        (compiled,) = connection.execute("SELECT COUNT(*) FROM jobs WHERE compile_seconds > 0").fetchone()
    assert compiled == 1 and modes.get("stitched", 0) > 0, modes  # the plugin really ran stitched steps
    # Every training step is in a window (the last, partial one closed at the end); no side run is:
    # before, each global-step read and eval counted, and the first eval crashed the job.
    assert sum(modes.values()) == STEPS, modes
