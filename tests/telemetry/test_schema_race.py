"""Several processes on one fresh SQLite file (the ranks of one job) all get their rows in.

Regression: the rank that lost the race to create the schema took the CREATE TABLE error for an
outage, spooled its rows, and kept a half-connected engine (seen as a flaky Horovod test).
Processes, not threads: ranks are processes, and Alembic's migration context is process-global.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import sqlalchemy as sa

from stitchfleet.telemetry import models as tables

ROOT = Path(__file__).resolve().parents[2]
RANKS = 4

_RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from stitchfleet import settings
    from stitchfleet.telemetry.recorder import Recorder
    from stitchfleet.telemetry.rows import JobKey, JobStarted

    url, state, go, index = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    current = settings.load({"STITCHFLEET_STATE_DIR": state})
    while not go.exists():
        time.sleep(0.01)
    recorder = Recorder(url, settings=current, metrics_port=0)
    recorder.record(JobStarted(JobKey("local", "default", "race", "uid-1"), rank=index, world_size=index + 1))
    recorder.close(timeout=60)
    print(f"written {recorder.stats.written} spooled {recorder.stats.spooled}")
    """
)


def test_concurrent_first_use_creates_the_schema_once_and_loses_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    go = tmp_path / "go"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, url, str(tmp_path / f"rank{i}"), str(go), str(i)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(RANKS)
    ]
    go.touch()
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    for rank, (out, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err
        assert out.strip() == "written 1 spooled 0", out + err
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        sizes = connection.execute(sa.select(tables.Job.world_size)).scalars().all()
    engine.dispose()
    assert sizes == [RANKS]
