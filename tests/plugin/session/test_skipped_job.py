"""A job whose setup is skipped imports neither the compiler's pipeline nor the graph rewrite (issue 29 item 6).

The hook decides the skip from the job's length and the backend's fixed setup cost (`job_length.short`), or from
the fleet's slower verdict on its graph (`job_verdict.recall`); only a job that sets up imports `job_setup` and with
it the compiler, the twin and the rewrite (docs/plugin/session.md).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from stitchfleet.plugin.setup import job_verdict
from stitchfleet.telemetry import database
from stitchfleet.telemetry import rows as r
from tests.telemetry.workload import write

pytestmark = pytest.mark.tf
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


# and the probes' schedule (what a setup would explore), the job's setup record when read (its builder's identity:
# the kernel cache's and the native build's), and what the fleet's verdict needs: the graph's identity
VERDICT = frozenset(
    {
        "stitchfleet.plugin.control",
        "stitchfleet.plugin.control.schedule",
        "stitchfleet.compiler.targets.cache",
        "stitchfleet.compiler.targets.native_build",
        "stitchfleet.plugin.graph.graph_identity",
    }
)


def _run(tmp_path: Path, *args: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_")}
    env.update(
        PYTHONPATH=str(ROOT),
        STITCHFLEET_ENABLED="1",
        STITCHFLEET_STATE_DIR=str(tmp_path),
        STITCHFLEET_CACHE_DIR=str(tmp_path / "cache"),
        STITCHFLEET_BACKEND="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    done = subprocess.run(
        [sys.executable, str(JOB), *args], env=env, capture_output=True, text=True, timeout=240, check=True
    )
    return dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in done.stdout.splitlines())


def _key_at_begin(graph: tf.Graph) -> tuple[str, str, str]:
    """The job's key as its hook computes it at `begin`: after the session's own hooks added their ops (the step
    counter reads the global step), a hook placed after the user's as the boot shim places it."""
    keys: list[tuple[str, str, str]] = []

    class Capture(tf.compat.v1.train.SessionRunHook):
        def begin(self) -> None:
            keys.append(job_verdict.job_key(tf.compat.v1.get_default_graph(), "cpu"))

    with graph.as_default():
        stop = tf.compat.v1.train.StopAtStepHook(num_steps=1)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[stop, Capture()]):
            pass
    return keys[0]


def test_a_skipped_job_imports_no_compiler_pipeline_and_no_graph_rewrite(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out["runs"] == "300" and out["hooks"] == "1"
    assert "cannot pay back" in out["skipped"] or "plans 300 steps" in out["skipped"], out["skipped"]
    loaded = set(out["loaded"].split())
    assert loaded - DECIDING - VERDICT == set(), f"a skipped job imported {sorted(loaded - DECIDING - VERDICT)}"
    assert "stitchfleet.compiler.pipeline" not in loaded and "stitchfleet.plugin.graph.twin" not in loaded


def test_a_job_the_fleet_knows_loses_skips_before_importing_the_compiler(tmp_path: Path) -> None:
    # Before, the verdict was read after `job_setup`'s import (0.5 s, 0.7 s under load): the cheap skip's path.
    spec = importlib.util.spec_from_file_location("skipped_job", JOB)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    key = _key_at_begin(script.job_graph())
    now, url = dt.datetime.now(dt.UTC), f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(url)
    write(  # two earlier jobs found stitching slower on this graph (STITCHFLEET_SLOWER_JOBS' default)
        url,
        [r.ProbeVerdict(r.JobKey("local", "default", "old", uid), *key, "slower", "job: lost", now) for uid in "ab"],
    )
    out = _run(tmp_path, "3000")  # long enough to set up: only the verdict says no
    assert out["runs"] == "3000" and out["hooks"] == "1"
    assert out["key"] == str(key)
    assert out["skipped"].startswith("the fleet found stitching slower than TF on this job's graph"), out["skipped"]
    loaded = set(out["loaded"].split())
    assert loaded - DECIDING - VERDICT == set(), f"a job known to lose imported {sorted(loaded - DECIDING - VERDICT)}"
