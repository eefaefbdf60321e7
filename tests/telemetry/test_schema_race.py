"""Several processes on one fresh database (the ranks of one job: a SQLite file, or PostgreSQL) all get their rows in.

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

from stitchfleet import settings
from stitchfleet.telemetry import database
from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry.recorder import Recorder
from stitchfleet.telemetry.rows import JobKey, JobStarted

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


def test_concurrent_first_use_creates_the_schema_once_and_loses_nothing(tmp_path: Path, any_url: str) -> None:
    url = any_url
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


def test_threads_of_one_process_migrate_their_own_databases_one_at_a_time(tmp_path: Path) -> None:
    """Regression: two recorders in one process (two ranks' ledgers in test_schedule) migrated at once and
    Alembic's process-wide context ran one's DDL on the other's SQLite connection: a segfault. Now every
    database of the process reaches the head revision."""
    import threading

    from alembic.script import ScriptDirectory

    from stitchfleet.telemetry import database

    urls = [f"sqlite:///{tmp_path / f'db{k}.sqlite'}" for k in range(6)]
    errors: list[BaseException] = []

    def upgrade(url: str) -> None:
        try:
            database.upgrade(url)
        except BaseException as err:  # the assertion below names it
            errors.append(err)

    threads = [threading.Thread(target=upgrade, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    head = ScriptDirectory(str(database.MIGRATIONS)).get_current_head()
    for url in urls:
        engine = sa.create_engine(url)
        try:
            assert database.current_revision(engine) == head
        finally:
            engine.dispose()


def test_a_schema_short_of_the_head_is_migrated_before_the_first_write(tmp_path: Path, any_url: str) -> None:
    """Regression (CI, session 7): a rank read the revision while another process was half-way through the
    migrations (0002 stored, 0003's `task_weeks` not yet made), took "some revision" for "ready", and its
    first write failed with "no such table: task_weeks" and was spooled. A database stopped at an older
    revision is the same state, held still: the recorder must bring it to the head and write."""
    database.upgrade(any_url, "0002")
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state")})
    recorder = Recorder(any_url, settings=current, metrics_port=0)
    recorder.record(JobStarted(JobKey("local", "default", "old-schema", "uid-2"), rank=0, world_size=1))
    recorder.close(timeout=60)
    assert (recorder.stats.written, recorder.stats.spooled) == (1, 0)
    engine = database.connect(any_url)
    try:
        assert database.current_revision(engine) == database.head_revision()
    finally:
        engine.dispose()
