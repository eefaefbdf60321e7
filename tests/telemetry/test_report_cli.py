"""`stitchfleet report weekly`: formats, output file, and clear errors with exit status 2."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from stitchfleet import cli
from tests.telemetry.tiny_fleet import write_fleet


def test_markdown_to_stdout(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_fleet(sqlite_url)
    assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# stitchfleet weekly savings report: 2026-W47")
    assert "| bert-b " in out


def test_csv_tables_to_files(sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_fleet(sqlite_url)
    base = ["report", "weekly", "--week", "2026-W47", "--db", sqlite_url, "--format", "csv"]
    assert cli.main([*base, "--output", str(tmp_path / "jobs.csv")]) == 0
    assert "wrote csv report for 2026-W47 (4 tasks)" in capsys.readouterr().out
    jobs = list(csv.DictReader(io.StringIO((tmp_path / "jobs.csv").read_text())))
    assert [row["job_name"] for row in jobs] == ["bert-b", "resnet-a", "resnet-a", "vit-c"]
    assert cli.main([*base, "--csv-table", "rollups", "-o", str(tmp_path / "rollups.csv")]) == 0
    rollups = list(csv.DictReader(io.StringIO((tmp_path / "rollups.csv").read_text())))
    assert rollups[-1]["dimension"] == "fleet"


def test_html_to_a_file(sqlite_url: str, tmp_path: Path) -> None:
    write_fleet(sqlite_url)
    target = tmp_path / "week.html"
    assert (
        cli.main(["report", "weekly", "--week", "2026-W47", "--db", sqlite_url, "--format", "html", "-o", str(target)])
        == 0
    )
    assert "data:image/png;base64," in target.read_text()


def test_bad_week(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "weekly", "--week", "2026-47", "--db", sqlite_url]) == 2
    err = capsys.readouterr().err
    assert "bad week '2026-47': expected an ISO week YYYY-Www, e.g. 2026-W47" in err


def test_unreachable_database(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql+psycopg://report:secret@127.0.0.1:1/telemetry"
    assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stitchfleet report weekly: cannot use database postgresql+psycopg://report:***@127.0.0.1:1")
    assert "secret" not in err and "Traceback" not in err


def test_database_without_schema(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", sqlite_url]) == 2
    assert "run `stitchfleet db upgrade` first" in capsys.readouterr().err


def test_unwritable_output(sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_fleet(sqlite_url)
    target = tmp_path / "missing-dir" / "r.md"
    assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", sqlite_url, "-o", str(target)]) == 1
    assert f"cannot write {target}" in capsys.readouterr().err


def test_top_below_one(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "weekly", "--db", sqlite_url, "--top", "0"]) == 2
    assert "--top 0: expected 1 or more" in capsys.readouterr().err


def test_csv_of_an_unusable_database_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "jobs.csv"
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", url, "--format", "csv", "-o", str(target)]) == 2
    assert "run `stitchfleet db upgrade` first" in capsys.readouterr().err
    assert not target.exists()


def test_the_local_report_loads_the_spool_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that ran as written spooled its rows without a database client (`Ledger.spool_meanwhile`): the report
    on the local database loads them before it reads, so the job is in it; the file is then gone (loaded once)."""
    from stitchfleet import settings
    from stitchfleet.plugin.fleet.ledger import Ledger

    monkeypatch.setenv("STITCHFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("STITCHFLEET_JOB_NAME", "spooled-job")
    monkeypatch.delenv("STITCHFLEET_DB_URL", raising=False)
    settings.reset()
    try:
        ledger = Ledger(settings.current(), 0, 1)
        ledger.started()
        ledger.spool_meanwhile()
        ledger.setup_skipped("setup skipped: job too short", "ran as written")
        ledger.close()
        assert not (tmp_path / "state" / "telemetry.db").exists()
        assert cli.main(["report", "weekly", "--format", "csv"]) == 0
    finally:
        settings.reset()
    jobs = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["job_name"] for row in jobs] == ["spooled-job"]
    assert not list((tmp_path / "state" / "spool").glob("*.jsonl"))
