"""The weekly report lists the fleet's memory: clusters quarantined for a mismatch, and slower ones.

A real SQLite database with a job that reverted a cluster for a numeric mismatch, and probe findings
of other jobs; `stitchfleet report weekly` in Markdown and HTML shows both lists as they are now.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from stitchfleet import cli
from stitchfleet.telemetry import database
from stitchfleet.telemetry import rows as r
from tests.telemetry.workload import job_key, workload, write

NOW = dt.datetime.now(dt.UTC)
KEY = ("fp-gelu", "cpu:Xeon x8", "f32[8,768]")


def _slower(*uids: str) -> list[r.Row]:
    return [r.ProbeVerdict(job_key(uid), *KEY, "slower", recorded_at=NOW) for uid in uids]


def test_markdown_lists_the_quarantine_and_the_slower_verdicts(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database.upgrade(sqlite_url)
    write(sqlite_url, workload("run-1", windows=4, ranks=1) + _slower("run-7"))
    assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    quarantine = out.split("## Fleet memory: quarantined for a numeric mismatch")[1].split("## ")[0]
    assert "| fp-ln-bwd   | 2026-11-16 08:00        | vision/resnet-train | numeric_mismatch |" in quarantine
    assert "No cluster is slower on any device profile." in out  # one job's finding is no verdict
    write(sqlite_url, _slower("run-8"))
    assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", sqlite_url]) == 0
    slower = capsys.readouterr().out.split("## Fleet memory: slower than TF")[1].split("\n---\n")[0]
    expires = (NOW + dt.timedelta(days=7)).strftime("%Y-%m-%d %H:%M")
    assert "Found slower by at least 2 jobs within 7 days of each other" in slower
    assert f"| fp-gelu     | cpu:Xeon x8    | f32[8,768] |                2 | {expires} |" in slower


def test_html_lists_both_and_says_when_a_list_is_empty(sqlite_url: str, tmp_path: Path) -> None:
    database.upgrade(sqlite_url)
    write(sqlite_url, _slower("run-7", "run-8"))
    target = tmp_path / "week.html"
    argv = ["report", "weekly", "--week", "2026-W47", "--db", sqlite_url, "--format", "html", "-o", str(target)]
    assert cli.main(argv) == 0
    page = target.read_text()
    assert "<h2>Fleet memory: quarantined for a numeric mismatch</h2>" in page
    assert "<p>No cluster is quarantined.</p>" in page
    assert '<td>fp-gelu</td><td>cpu:Xeon x8</td><td>f32[8,768]</td><td class="num">2</td>' in page


def test_jobs_evidence_is_listed_once_corroborated_by_two_namespaces(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database.upgrade(sqlite_url)

    def revert(namespace: str, uid: str) -> r.Row:
        return r.JobVerdict(r.JobKey("gpu-east", namespace, "train", uid), "fp-erf", "reverted", "mismatch")

    write(sqlite_url, [revert("vision", "run-1"), revert("vision", "run-2")])

    def quarantine() -> str:
        assert cli.main(["report", "weekly", "--week", "2026-W47", "--db", sqlite_url]) == 0
        return capsys.readouterr().out.split("## Fleet memory: quarantined for a numeric mismatch")[1].split("## ")[0]

    assert "fp-erf" not in quarantine()  # one namespace's jobs: that namespace's, not the fleet's
    write(sqlite_url, [revert("research", "run-3")])
    listed = quarantine()
    assert "fp-erf" in listed and "vision/train" in listed and "2 namespaces' jobs: mismatch" in listed
