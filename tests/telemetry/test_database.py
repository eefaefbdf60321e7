"""database: connect, migrations up and down, no drift between models and migrations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from stitchfleet.telemetry import database

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"jobs", "step_windows", "events", "clusters", "task_weeks", "week_rollups", "job_verdicts"}


def head_revision() -> str:
    """The newest migration script's revision, read from the scripts themselves."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(database.MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def test_upgrade_check_downgrade(any_url: str) -> None:
    database.upgrade(any_url)
    engine = database.connect(any_url)
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
        assert database.current_revision(engine) == head_revision() == "0007"
        database.check(any_url)  # raises when models and migrations drift apart
        database.upgrade(any_url)  # a second upgrade is a no-op
        database.downgrade(any_url)
        assert not TABLES & set(inspect(engine).get_table_names())
        assert database.current_revision(engine) is None
    finally:
        engine.dispose()


def test_sqlite_parent_directory_is_created(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "telemetry.db"
    database.upgrade(f"sqlite:///{target}")
    assert target.is_file()


def test_malformed_url_is_named() -> None:
    with pytest.raises(database.DatabaseError, match=r"malformed database URL 'not a url'"):
        database.connect("not a url")


def test_unknown_driver_is_named() -> None:
    with pytest.raises(database.DatabaseError, match="nosuchdb"):
        database.connect("nosuchdb://host/db")


def test_the_head_revision_is_alembic_s_without_importing_it(tmp_path: Path) -> None:
    assert database.head_revision() == head_revision()
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / "__init__.py").write_text("")
    (versions / "0001_a.py").write_text('revision: str = "0001"\ndown_revision: str | None = None\n')
    (versions / "0002_b.py").write_text('"""Revises: 0001"""\nrevision = "0002"\ndown_revision = "0001"\n')
    assert database.head_revision(versions) == "0002"
    branched = tmp_path / "branched"  # head_revision is cached per folder
    branched.mkdir()
    for path in versions.glob("0*.py"):
        (branched / path.name).write_text(path.read_text())
    (branched / "0003_c.py").write_text('revision = "0003"\ndown_revision = "0001"\n')  # a branch: two heads
    with pytest.raises(database.DatabaseError, match="2 head revisions"):
        database.head_revision(branched)


def test_a_job_writing_to_a_current_schema_never_imports_alembic(tmp_path: Path) -> None:
    # alembic (mako, pygments) cost ~0.2 s of CPU on a thread beside the job's steps at every job's first write
    url = f"sqlite:///{tmp_path / 't.db'}"
    database.upgrade(url)
    script = (
        "import sys\n"
        "from stitchfleet import settings\n"
        "from stitchfleet.telemetry import rows as r\n"
        "from stitchfleet.telemetry.recorder import Recorder\n"
        f"recorder = Recorder({url!r}, settings=settings.current())\n"
        "recorder.record(r.Event(r.JobKey('local', 'default', 'j', 'u'), 'setup', reason='setup skipped'))\n"
        "recorder.close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    env = {**os.environ, "STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM events")).scalar() == 1
    finally:
        engine.dispose()


def test_a_check_after_alembic_was_first_imported_under_a_closed_stream(tmp_path: Path) -> None:
    # alembic is imported on demand now: its Config's default stdout is the sys.stdout of that moment (in the
    # suite, one test's captured output), closed by the time another test's `check` prints to it
    url = f"sqlite:///{tmp_path / 't.db'}"
    script = (
        "import io, sys\n"
        "from stitchfleet.telemetry import database\n"
        "real, sys.stdout = sys.stdout, io.StringIO()\n"
        f"engine = database.connect({url!r})\n"
        "database.alembic_config(engine)\n"
        "sys.stdout.close()\n"
        "sys.stdout = real\n"
        f"database.upgrade({url!r})\n"
        f"database.check({url!r})\n"
    )
    env = {**os.environ, "STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "No new upgrade operations detected." in done.stdout
