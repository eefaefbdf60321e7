"""scripts/tf_data_close.py: one short trial per condition prints a table row each; bad arguments are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import tf_data_close

pytestmark = pytest.mark.tf
ROOT = Path(__file__).resolve().parents[2]


def test_one_trial_per_condition_prints_a_row_each() -> None:
    # In a child process: main() calls tf.compat.v1.disable_v2_behavior(), which holds for the rest of the process;
    # run in pytest's, every later test of that process got ref variables instead of resource ones (tests/demo/
    # test_models and tests/plugin/graph/test_twin_runs failed after it on the same xdist worker).
    command = [sys.executable, str(ROOT / "scripts" / "tf_data_close.py"), "--run", "0.2", "--trials", "1"]
    done = subprocess.run([*command, "--slow", "30"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    rows = [line for line in out if line.startswith("| ") and not line.startswith("| condition")]
    assert [row.split(" | ")[0] for row in rows] == [f"| {name}" for name in tf_data_close.CONDITIONS]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == "1" and cells[4] == "0"  # one close, none over 30 s
        assert float(cells[2]) >= 0.0 and float(cells[2]) == pytest.approx(float(cells[3]), abs=0.006)  # one close


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        tf_data_close.main(["--trials", "0"])
    assert stopped.value.code == 2 and "--trials at least 1" in capsys.readouterr().err
