"""`stitchfleet fleet quarantine list|clear|confirm` on a SQLite database: the admin's word, with an audit trail."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchfleet import cli
from stitchfleet.telemetry import database, fleet_quarantine, store
from stitchfleet.telemetry import rows as r


def evidence(url: str, namespace: str, job_uid: str, fingerprint: str) -> None:
    key = r.JobKey("gpu-east", namespace, f"train-{job_uid}", job_uid)
    engine = database.connect(url)
    try:
        with engine.begin() as connection:
            store.write_rows(connection, [r.JobVerdict(key, fingerprint, "reverted", reason="mismatch")])
    finally:
        engine.dispose()


def test_list_confirm_clear_with_the_audit_trail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    database.upgrade(url)
    evidence(url, "vision", "job-a", "fp-ln")
    evidence(url, "research", "job-b", "fp-ln")
    evidence(url, "vision", "job-c", "fp-gelu")
    assert cli.main(["fleet", "quarantine", "list", "--db", url]) == 0
    listed = capsys.readouterr().out
    assert "fp-ln                    corroborated     2  research,vision" in listed
    assert "fp-gelu                  namespace        1  vision" in listed
    assert (
        cli.main(["fleet", "quarantine", "confirm", "fp-gelu", "--reason", "seen on A100", "--by", "bob", "--db", url])
        == 0
    )
    assert (
        cli.main(["fleet", "quarantine", "clear", "fp-ln", "--reason", "fixed in 0.9", "--by", "alice", "--db", url])
        == 0
    )
    capsys.readouterr()
    assert cli.main(["fleet", "quarantine", "list", "--db", url]) == 0
    listed = capsys.readouterr().out
    assert "fp-gelu                  confirmed        1  vision  reverted by bob: seen on A100" in listed
    assert "fp-ln                    cleared          0  -  cleared by alice: fixed in 0.9" in listed
    assert "quarantine_cleared    fp-ln  alice: fixed in 0.9" in listed
    assert "quarantine_confirmed  fp-gelu  bob: seen on A100" in listed
    engine = database.connect(url)
    try:
        assert fleet_quarantine.reverted_for(engine, "speech", "job-z") == {"fp-gelu"}
    finally:
        engine.dispose()


def test_an_action_without_a_reason_or_a_database_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    database.upgrade(url)
    assert cli.main(["fleet", "quarantine", "clear", "fp-x", "--reason", " ", "--by", "alice", "--db", url]) == 2
    assert "needs who (--by) and why (--reason)" in capsys.readouterr().err
    bad = "postgresql+psycopg://nobody:secret@127.0.0.1:1/none"
    assert cli.main(["fleet", "quarantine", "list", "--db", bad]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "secret" not in error
