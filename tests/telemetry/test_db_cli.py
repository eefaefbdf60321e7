"""`stitchfleet db upgrade|downgrade`: migrates the given database, explains a bad one."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from stitchfleet import cli
from stitchfleet.telemetry import database


def test_upgrade_then_downgrade(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli' / 'telemetry.db'}"
    assert cli.main(["db", "upgrade", "--db", url]) == 0
    assert "is at revision head" in capsys.readouterr().out
    engine = database.connect(url)
    assert "step_windows" in inspect(engine).get_table_names()
    assert cli.main(["db", "downgrade", "--db", url]) == 0
    assert "step_windows" not in inspect(engine).get_table_names()
    engine.dispose()


def test_default_database_comes_from_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from stitchfleet import settings

    monkeypatch.setenv("STITCHFLEET_STATE_DIR", str(tmp_path / "state"))
    settings.reset()
    try:
        assert cli.main(["db", "upgrade"]) == 0
    finally:
        settings.reset()
    assert (tmp_path / "state" / "telemetry.db").is_file()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("not a url", "malformed database URL 'not a url'"),
        (
            "postgresql+psycopg://sf:secret@127.0.0.1:9/x",
            "cannot use database postgresql+psycopg://sf:***@127.0.0.1:9/x",
        ),
    ],
)
def test_bad_database_is_a_clear_error(url: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["db", "upgrade", "--db", url]) == 1
    err = capsys.readouterr().err
    assert words in err
    assert "secret" not in err
    assert "Traceback" not in err
