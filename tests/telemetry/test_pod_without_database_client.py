"""A pod without SQLAlchemy (or alembic, psycopg, prometheus_client) still records: rows go to the spool.

The child process blocks those packages before anything imports them, records a job through the
plugin's Ledger, and exits; `stitchfleet telemetry ingest` then finds the job's windows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import select

from stitchfleet import cli
from stitchfleet.telemetry import database, models

CHILD = textwrap.dedent(
    """
    import sys
    for name in ("sqlalchemy", "alembic", "psycopg", "psycopg2", "prometheus_client"):
        sys.modules[name] = None  # any import of them raises ImportError, as in a bare TF image
    from stitchfleet import settings
    from stitchfleet.plugin.fleet.ledger import Ledger, SpoolSink
    ledger = Ledger(settings.current(), rank=0, world_size=1)
    assert isinstance(ledger.recorder, SpoolSink), ledger.recorder
    ledger.started()
    for index in range(3):
        ledger.window(
            window_index=index, first_step=10 * index, last_step=10 * index + 9, iterations=10,
            mode="baseline", step_seconds_sum=1.0,
        )
    ledger.finished("finished")
    ledger.close()
    assert ledger.reverted(timeout=1.0) == set()
    print(ledger.key.job_uid)
    """
)


def test_rows_reach_the_database_through_the_spool(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "STITCHFLEET_STATE_DIR": str(state), "STITCHFLEET_POD_NAME": "trainer-0"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    job_uid = done.stdout.strip().splitlines()[-1]
    assert "telemetry rows go to the spool" in done.stderr
    assert "dropped" not in done.stderr, done.stderr
    assert list((state / "spool").glob("*.jsonl")), "the rows were not spooled"
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    assert cli.main(["telemetry", "ingest", str(state / "spool"), "--db", url]) == 0
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            windows = connection.execute(
                select(models.StepWindow.window_index, models.StepWindow.iterations)
                .join(models.Job)
                .where(models.Job.job_uid == job_uid)
                .order_by(models.StepWindow.window_index)
            ).all()
            status = connection.execute(select(models.Job.status).where(models.Job.job_uid == job_uid)).scalar_one()
    finally:
        engine.dispose()
    assert [tuple(row) for row in windows] == [(0, 10), (1, 10), (2, 10)]
    assert status == "finished"
