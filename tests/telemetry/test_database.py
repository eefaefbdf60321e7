"""database: connect, migrations up and down, no drift between models and migrations."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from stitchfleet.telemetry import database

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
        assert database.current_revision(engine) == head_revision() == "0005"
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
