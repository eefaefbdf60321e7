"""Horovod: two ranks on CPU (Gloo); one rank's kernel is corrupted, both revert at the same step."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from stitchfleet.telemetry import models as tables

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.horovod, pytest.mark.tf, pytest.mark.slow]


def test_one_corrupted_rank_reverts_both_ranks_at_the_same_step(tmp_path: Path) -> None:
    horovodrun = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [
        horovodrun,
        "-np",
        "2",
        "-H",
        "localhost:2",
        sys.executable,
        "-m",
        "tests.plugin.horovod_job",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = re.findall(r"rank (\d) reverted_at (\S+) fingerprint (\S+) losses (\d+)", done.stdout)
    assert sorted(r for r, *_ in lines) == ["0", "1"]
    steps = {s for _, s, _, _ in lines}
    assert len(steps) == 1 and steps != {"None"}, lines
    assert {n for *_, n in lines} == {"16"}
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with engine.connect() as connection:
        window_ranks = set(connection.execute(sa.select(tables.StepWindow.rank)).scalars())
        revert_ranks = set(
            connection.execute(sa.select(tables.Event.rank).where(tables.Event.kind == "revert")).scalars()
        )
    engine.dispose()
    assert window_ranks == {0, 1} and revert_ranks == {0, 1}
