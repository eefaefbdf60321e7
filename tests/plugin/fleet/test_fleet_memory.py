"""What a job reads of the fleet's memory: old and new operator answers, old and new cache files, SQLite.

A pod may meet an operator that answers only {"reverted": [...]} (older than slower verdicts) and a
cache file an older plugin wrote: both still give the quarantine, with no slower verdict. A new
answer's slower and faster verdicts are read, a malformed one (or one in the other outcome's list) skipped,
an expired cached one dropped. Outside
Kubernetes the job reads the same from the database.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest

from stitchfleet import settings
from stitchfleet.plugin.fleet.fleet_memory import CACHE_FILE, FleetMemory
from stitchfleet.plugin.fleet.ingest_client import DeliveryError, Endpoint, IngestClient, memory_of
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.horovod.setup_agreement import Agreement, agreed
from stitchfleet.telemetry import database
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.slow_verdicts import Remembered, SlowerVerdict
from tests.operator.operator_process import free_port
from tests.telemetry.workload import write

NOW = dt.datetime.now(dt.UTC)
LIVE = SlowerVerdict("fp-gelu", "cpu:Xeon x8", "f32[8,768]", 2, NOW + dt.timedelta(days=3))
EXPIRED = SlowerVerdict("fp-softmax", "cpu:Xeon x8", "f32[8,8]", 2, NOW - dt.timedelta(minutes=1))


FAST = SlowerVerdict("fp-ln", "cpu:Xeon x8", "f32[8,768]", 2, NOW + dt.timedelta(days=3), ProbeOutcome.FASTER)


def test_an_old_operators_answer_gives_the_quarantine_and_no_slower_verdict() -> None:
    assert memory_of({"reverted": ["fp-ln-bwd"]}) == Remembered(frozenset({"fp-ln-bwd"}))


def test_a_new_answer_gives_every_list_and_skips_a_malformed_verdict() -> None:
    answer = {
        "reverted": ["fp-ln-bwd"],
        "slower": [LIVE.to_json(), {"fingerprint": "fp-x"}, "not an object"],
        "faster": [FAST.to_json()],
    }
    assert memory_of(answer) == Remembered(frozenset({"fp-ln-bwd"}), (LIVE,), (FAST,))
    assert memory_of({"reverted": [], "slower": "not a list"}) == Remembered()
    with pytest.raises(DeliveryError, match="malformed quarantine answer"):
        memory_of({"slower": [LIVE.to_json()]})


def test_a_verdict_in_the_other_outcomes_list_is_skipped() -> None:
    """A faster verdict filed under "slower" must not turn a cluster off, nor a slower one keep it unprobed."""
    answer = {"reverted": [], "slower": [FAST.to_json()], "faster": [LIVE.to_json()]}
    assert memory_of(answer) == Remembered()


def test_the_cache_keeps_faster_verdicts_for_a_pod_that_loses_the_operator(tmp_path: Path) -> None:
    document = {
        "reverted": [],
        "slower": [],
        "faster": [FAST.to_json(), dataclasses.replace(FAST, expires=NOW).to_json()],
    }
    (tmp_path / CACHE_FILE).write_text(json.dumps(document))
    memory = FleetMemory(_unreachable(tmp_path), tmp_path, timeout=0.5).read()
    assert memory.source == "cache" and memory.faster == (FAST,) and memory.slower == ()


def _unreachable(tmp_path: Path) -> IngestClient:
    token = tmp_path / "token"
    token.write_text("t\n")
    return IngestClient(Endpoint("127.0.0.1", free_port(), "/ingest/v1", "stitchfleet", "", token, 1.0))


def test_an_old_cache_file_still_gives_the_quarantine(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILE).write_text(json.dumps({"reverted": ["fp-ln-bwd"], "saved_at": 1.0}))
    memory = FleetMemory(_unreachable(tmp_path), tmp_path, timeout=1.0).read()
    assert (memory.source, memory.reverted, memory.slower) == ("cache", frozenset({"fp-ln-bwd"}), ())


def test_a_cached_slower_verdict_is_read_until_it_expires(tmp_path: Path) -> None:
    document = {"reverted": [], "slower": [LIVE.to_json(), EXPIRED.to_json()], "saved_at": 1.0}
    (tmp_path / CACHE_FILE).write_text(json.dumps(document))
    memory = FleetMemory(_unreachable(tmp_path), tmp_path, timeout=1.0).read()
    assert memory.source == "cache" and memory.slower == (LIVE,)


def test_a_local_job_reads_the_slower_verdicts_from_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(url)
    findings = [
        r.ProbeVerdict(r.JobKey("local", "default", "job", uid), *LIVE.key, "slower", recorded_at=NOW)
        for uid in ("run-1", "run-2")
    ]
    write(url, findings)
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "STITCHFLEET_JOB_UID": "run-3"})
    ledger = Ledger(current, 0, 1, url)
    try:
        memory = ledger.recall()
    finally:
        ledger.close()
    assert memory.source == "database" and memory.reverted == frozenset()
    assert [(v.key, v.jobs) for v in memory.slower] == [(LIVE.key, 2)]
    three = settings.load({**_env(tmp_path), "STITCHFLEET_SLOWER_JOBS": "3"})
    stricter = Ledger(three, 0, 1, url)
    try:
        assert stricter.recall().slower == ()  # STITCHFLEET_SLOWER_JOBS=3: two jobs are not enough
    finally:
        stricter.close()


def _env(tmp_path: Path) -> dict[str, str]:
    return {"STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "STITCHFLEET_JOB_UID": "run-4"}


def test_one_job_alone_can_never_be_enough() -> None:
    with pytest.raises(settings.SettingsError, match="STITCHFLEET_SLOWER_JOBS"):
        settings.load({"STITCHFLEET_SLOWER_JOBS": "1"})


def test_horovod_ranks_that_read_different_memories_still_install_the_same_clusters() -> None:
    """Ranks read the fleet's memory apart: a verdict can land between two ranks' reads. Rank 1 knew
    cluster 1 slower and left it off; rank 0 did not and installed it. The agreement installs what every
    rank installed, so cluster 1 is off on both, and both run the same probe schedule."""
    knew_nothing, knew_the_verdict = Agreement.vector([0, 1, 2], ok=True), Agreement.vector([0, 2], ok=True)
    assert agreed(knew_nothing + knew_the_verdict, 2) == [0, 2]
    assert agreed(knew_nothing + Agreement.vector([], ok=False), 2) is None  # a failed setup: all leave it to TF
