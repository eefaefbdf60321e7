"""Plain `tf.compat.v1.Session` loops are stitched under auto-attach, or their telemetry says why not.

Issue 30 item 4: only MonitoredSession was hooked, so a hand-written Session loop (Horovod's word2vec
example) got nothing, and nothing said so. Each case runs in a fresh interpreter, as a job does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from stitchfleet.telemetry import models as tables
from tests.shared_cache import kernel_cache

pytestmark = pytest.mark.tf
ROOT = Path(__file__).resolve().parents[3]
JOB = Path(__file__).resolve().parents[1] / "plain_session_job.py"
STEPS = 16


def _run(tmp: Path, enabled: str, *extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_")}
    env.update(
        PYTHONPATH=str(ROOT),
        STITCHFLEET_ENABLED=enabled,
        STITCHFLEET_STATE_DIR=str(tmp),
        STITCHFLEET_CACHE_DIR=str(kernel_cache()),
        STITCHFLEET_JOB_UID="plain",
        STITCHFLEET_WARMUP_STEPS="1",
        STITCHFLEET_BASELINE_STEPS="2",
        STITCHFLEET_SLOWDOWN_MARGIN="1000",
        STITCHFLEET_PROBE_STEPS="0",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    command = [sys.executable, str(JOB), str(STEPS), *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)


def _events(tmp: Path, kind: str) -> list[str]:
    engine = sa.create_engine(f"sqlite:///{tmp / 'telemetry.db'}")
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.select(tables.Event.detail).where(tables.Event.kind == kind)).all()
    finally:
        engine.dispose()
    return [row[0] for row in rows]


def _windows(tmp: Path) -> int:
    engine = sa.create_engine(f"sqlite:///{tmp / 'telemetry.db'}")
    try:
        with engine.connect() as connection:
            return int(connection.execute(sa.select(sa.func.sum(tables.StepWindow.iterations))).scalar() or 0)
    finally:
        engine.dispose()


def test_a_plain_session_loop_is_stitched_and_trains_as_written(tmp_path: Path) -> None:
    on = _run(tmp_path, "1")
    off = _run(tmp_path / "off", "0")
    assert on["attached"] == "True" and off["attached"] == "False"
    assert int(on["calls"]) > 0, "stitched kernels ran"
    assert on["steps"] == str(STEPS)  # the eval runs are not training steps
    assert _windows(tmp_path) == STEPS
    assert [float(v) for v in on["losses"].split()] == pytest.approx(
        [float(v) for v in off["losses"].split()], rel=1e-4
    )


@pytest.mark.parametrize("how", ["finalize", "supervisor"])
def test_a_finalized_graph_says_not_attached(tmp_path: Path, how: str) -> None:
    """`supervisor`: tf.train.Supervisor finalizes the graph before its session (the corpus' PTB tutorial)."""
    out = _run(tmp_path, "1", how)
    off = _run(tmp_path / "off", "0", how)
    assert out["attached"] == "False" and "finalized" in out["reason"]
    assert any("finalized" in detail for detail in _events(tmp_path, "not_attached"))
    assert out["losses"] == off["losses"]  # the job computes what it computes without the plugin
