"""A job whose setup is skipped imports neither the compiler's pipeline nor the graph rewrite (issue 29 item 6).

The hook decides the skip from the job's length and the backend's fixed setup cost (`job_length.short`); only a
job that sets up imports `job_setup` and with it the compiler, the twin and the rewrite (docs/plugin/session.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
JOB = Path(__file__).resolve().parents[1] / "skipped_job.py"
# What deciding the skip needs: the training-step walk (does the graph train at all), the twin's name scope (is it
# stitched already), and the targets' profiles, which price a setup on the backend (`payback.fixed_seconds`).
DECIDING = frozenset(
    {
        "stitchfleet.plugin.graph",
        "stitchfleet.plugin.graph.op_graph",
        "stitchfleet.plugin.graph.training_steps",
        "stitchfleet.plugin.graph.twin_mark",
        "stitchfleet.compiler",
        "stitchfleet.compiler.devices",
        "stitchfleet.compiler.targets",
        "stitchfleet.compiler.targets.base",
        *(f"stitchfleet.compiler.targets.{name}" for name in ("cpu", "cuda", "cuda_cpu", "sim")),
    }
)


@pytest.mark.tf
def test_a_skipped_job_imports_no_compiler_pipeline_and_no_graph_rewrite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_")}
    env.update(
        PYTHONPATH=str(ROOT),
        STITCHFLEET_ENABLED="1",
        STITCHFLEET_STATE_DIR=str(tmp_path),
        STITCHFLEET_CACHE_DIR=str(tmp_path / "cache"),
        STITCHFLEET_BACKEND="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    done = subprocess.run([sys.executable, str(JOB)], env=env, capture_output=True, text=True, timeout=240, check=True)
    out = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in done.stdout.splitlines())
    assert out["runs"] == "300" and out["hooks"] == "1"
    assert "cannot pay back" in out["skipped"] or "plans 300 steps" in out["skipped"], out["skipped"]
    loaded = set(out["loaded"].split())
    assert loaded - DECIDING == set(), f"a skipped job imported {sorted(loaded - DECIDING)}"
    assert "stitchfleet.compiler.pipeline" not in loaded and "stitchfleet.plugin.graph.twin" not in loaded
