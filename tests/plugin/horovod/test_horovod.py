"""Horovod: two ranks on CPU (Gloo): a corrupted kernel on one rank, probing with timings that differ per rank."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from stitchfleet.telemetry import models as tables

ROOT = Path(__file__).resolve().parents[3]
# one xdist worker runs them all, one after another: two 2-rank jobs at once would be four TF ranks on 2 cores
pytestmark = [pytest.mark.horovod, pytest.mark.tf, pytest.mark.slow, pytest.mark.xdist_group("horovod")]


def _two_ranks(tmp_path: Path, scenario: str) -> str:
    """Runs tests.plugin.horovod_job on 2 local ranks; returns its stdout."""
    return _two_ranks_run(tmp_path, scenario).stdout


def _plugin_lines(stderr: str, rank: int, level: str) -> list[str]:
    """The plugin's log lines at `level` in one rank's stderr (horovodrun prefixes each line with its rank)."""
    return re.findall(rf"^\[{rank}\]<stderr>:{level} stitchfleet\.plugin (.+)$", stderr, re.MULTILINE)


def _two_ranks_run(tmp_path: Path, scenario: str) -> subprocess.CompletedProcess[str]:
    """Runs tests.plugin.horovod_job on 2 local ranks (it logs at INFO, as a user's job may)."""
    horovodrun = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    # --gloo: the controller these jobs ran on anyway (this Horovod has no MPI). Left to choose, horovodrun first
    # asks whether MPI was built, in a process of its own that imports TensorFlow: 4 s of every job on 2 cores.
    command = [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, "-m", "tests.plugin.horovod_job"]
    done = subprocess.run(
        [*command, str(tmp_path), scenario], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_one_corrupted_rank_reverts_both_ranks_at_the_same_step(tmp_path: Path) -> None:
    stdout = _two_ranks(tmp_path, "fault")
    lines = re.findall(r"rank (\d) reverted_at (\S+) fingerprint (\S+) losses (\d+)", stdout)
    assert sorted(r for r, *_ in lines) == ["0", "1"]
    steps = {s for _, s, _, _ in lines}
    assert len(steps) == 1 and steps != {"None"}, lines
    assert {n for *_, n in lines} == {"16"}
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with engine.connect() as connection:
        window_ranks = set(connection.execute(sa.select(tables.StepWindow.rank)).scalars())
        revert_ranks = set(
            connection.execute(sa.select(tables.Event.rank).where(tables.Event.kind == "revert")).scalars()
        )
    engine.dispose()
    assert window_ranks == {0, 1} and revert_ranks == {0, 1}


def test_two_ranks_probing_keep_the_same_clusters_at_the_same_steps(tmp_path: Path) -> None:
    done = _two_ranks_run(tmp_path, "probe")
    stdout = done.stdout
    # rank 0 alone tells the decisions every rank takes (rank_logs): its setup, its group probe, each cluster's
    told = _plugin_lines(done.stderr, 0, "INFO")
    assert any("cluster(s) stitched" in line for line in told) and any("group " in line for line in told), told
    assert _plugin_lines(done.stderr, 1, "INFO") == []
    found = dict(re.findall(r"rank (\d) decisions (.+)", stdout))
    assert sorted(found) == ["0", "1"]
    decisions = [json.loads(found[rank]) for rank in ("0", "1")]
    assert decisions[0] == decisions[1] and all(kept is not None for _, kept, _ in decisions[0])
    groups = [json.loads(group) for _, group in sorted(re.findall(r"rank (\d) group (.+)", stdout))]
    assert len(groups) == 2 and groups[0] == groups[1] and groups[0][0] is not None and "ms/step" in groups[0][1]
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    kinds = (tables.Event.kind.in_(("probe", "cluster_enabled")), tables.Event.cluster_fingerprint.is_not(None))
    with engine.connect() as connection:
        columns = (tables.Event.rank, tables.Event.cluster_fingerprint, tables.Event.step, tables.Event.reason)
        rows = list(connection.execute(sa.select(*columns).where(*kinds)))
    engine.dispose()
    # a rerun (a pair run again) is no decision: both ranks rerun the same pairs at the same steps, and decide once
    steps = [{(fp, step) for rank, fp, step, why in rows if rank == r and why != "probe rerun"} for r in (0, 1)]
    reruns = [{(fp, step) for rank, fp, step, why in rows if rank == r and why == "probe rerun"} for r in (0, 1)]
    assert steps[0] == steps[1] and len(steps[0]) == len(decisions[0])
    assert reruns[0] == reruns[1]


def _states(stdout: str) -> dict[str, dict[str, Any]]:
    """Each rank's 'state' line, by rank: parsed JSON, whose values each test reads as its scenario printed them."""
    found = {rank: json.loads(state) for rank, state in re.findall(r"rank (\d) state (.+)", stdout)}
    assert sorted(found) == ["0", "1"], stdout[-2000:]
    return found


def test_rank_zero_side_runs_never_shift_the_pairing(tmp_path: Path) -> None:
    states = _states(_two_ranks(tmp_path, "sideruns"))
    zero, one = states["0"], states["1"]
    assert zero["runs"] == 24 + 8 and one["runs"] == 24  # rank 0 ran 8 more runs than rank 1...
    assert zero["steps"] == one["steps"] == 24  # ...yet both counted the same training steps
    # every training step is in the telemetry on each rank, the agreement run included (issue 30 item 5)
    assert zero["iterations"] == one["iterations"] == 24
    assert zero["stitched"] == one["stitched"] and zero["stitched"] and zero["active"] and one["active"]
    assert zero["reverted"] == one["reverted"]


def test_a_cluster_one_rank_failed_to_compile_is_left_to_tf_on_every_rank(tmp_path: Path) -> None:
    done = _two_ranks_run(tmp_path, "compile")
    states = _states(done.stdout)
    # the failing rank warns of its own failure; rank 0, which tells the job's decisions, says why 5 is off there
    assert [
        w for w in _plugin_lines(done.stderr, 1, "WARNING") if "cluster 5 left to TF" in w and "compile failed" in w
    ]
    assert "stitchfleet: cluster 5 left to TF: another rank did not install it" in _plugin_lines(done.stderr, 0, "INFO")
    assert _plugin_lines(done.stderr, 0, "WARNING") == []
    zero, one = states["0"], states["1"]
    assert zero["stitched"] == one["stitched"] and 5 not in zero["stitched"] and len(zero["stitched"]) >= 2
    assert "not installed on every rank" in str(zero["off5"]) and "compile failed" in str(one["off5"])
    assert zero["steps"] == one["steps"] == 24 and zero["reverted"] == one["reverted"]


def test_a_rank_whose_setup_failed_still_joins_and_every_rank_leaves_the_job_to_tf(tmp_path: Path) -> None:
    states = _states(_two_ranks(tmp_path, "setup"))
    assert [states[r]["active"] for r in ("0", "1")] == [False, False]
    assert states["0"]["stitched"] == [] and states["1"]["stitched"] == []
    assert states["0"]["runs"] == states["1"]["runs"] == 24
    # each rank recorded why: rank 1 its own failure (raised before its ledger was opened), rank 0 the other's
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with engine.connect() as connection:
        query = sa.select(tables.Event.rank, tables.Event.reason).where(tables.Event.kind == "compile_failure")
        reasons = {(rank, reason.split(":")[0]) for rank, reason in connection.execute(query)}
    engine.dispose()
    assert reasons == {(1, "plugin setup failed"), (0, "another rank did not set up")}, reasons


def test_a_slower_verdict_only_one_rank_read_leaves_the_cluster_off_on_every_rank(tmp_path: Path) -> None:
    """Ranks read the fleet's memory apart (a verdict can land between two reads): the agreement keeps
    them on the same clusters, so they name the same collectives and run the same probe schedule."""
    import datetime as dt

    from stitchfleet.telemetry import database, store
    from stitchfleet.telemetry import rows as r
    from tests.plugin.hook_harness import hooked, train

    first, _ = hooked(tmp_path / "first", "first")  # the clusters' keys, as a job on this machine sees them
    train(3, first)
    assert first.controller is not None
    cluster = next(c for c in first.controller.clusters if c.index == 5)
    memory = f"sqlite:///{tmp_path / 'memory.sqlite'}"
    database.upgrade(memory)
    now, key = dt.datetime.now(dt.UTC), (cluster.fingerprint, cluster.profile, cluster.shapes)
    findings = [r.ProbeVerdict(r.JobKey("c", "n", "j", uid), *key, "slower", recorded_at=now) for uid in "ab"]
    engine = database.connect(memory)
    with engine.begin() as connection:
        store.write_rows(connection, findings)
    engine.dispose()
    states = _states(_two_ranks(tmp_path, "slower"))
    zero, one = states["0"], states["1"]
    assert zero["stitched"] == one["stitched"] and 5 not in zero["stitched"] and len(zero["stitched"]) >= 2
    assert str(one["off5"]).startswith("fleet: slower on cpu:") and "per 2 jobs" in str(one["off5"])
    assert "not installed on every rank" in str(zero["off5"])
    assert zero["steps"] == one["steps"] == 24 and zero["reverted"] == one["reverted"]


def test_a_rank_whose_own_records_skip_its_setup_still_joins_and_every_rank_runs_as_written(tmp_path: Path) -> None:
    """Ranks on different nodes weigh their setup on their own node's kernel cache: rank 1's holds a record of a
    last run that lost on this graph (`payback.estimate`: measured not to pay), rank 0's none. Rank 1 skips its
    setup yet joins the agreement; rank 0, set up, then leaves the job to TF too: no rank stitches a step."""
    from tests.plugin.recorded_events import events

    done = _two_ranks_run(tmp_path, "skip")
    states = _states(done.stdout)
    zero, one = states["0"], states["1"]
    # the mechanism as meant: rank 1 alone skipped, on its own record; rank 0 weighed none and set up
    assert zero["skipped"] is None and zero["set_up"] is True
    assert one["set_up"] is False and str(one["skipped"]).startswith("setup cannot pay back: its last run here ran")
    assert "200 stitched steps 5.0% slower than plain TF's step" in str(one["skipped"])
    # both ran the job to its end as written, alike: no stitched step, no controller, the same training
    assert zero["active"] is one["active"] is False and zero["stitched"] == one["stitched"] == []
    assert zero["backend_calls"] == one["backend_calls"] == 0
    assert zero["runs"] == one["runs"] == 24
    assert zero["loss"] == one["loss"] and zero["variables"] == one["variables"]
    # why, told: rank 1's skip in its telemetry (its information lines are rank 0's to tell: rank_logs), rank 0's
    # warning and event that another rank did not set up
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    [skipped] = [e for e in events(url, "setup", tmp_path / "rank1" / "state" / "spool") if e.rank == 1]
    assert (skipped.reason, skipped.detail) == ("setup skipped: measured not to pay", one["skipped"])
    told = "stitching is off for this job: another rank did not set up (failed or skipped)"
    assert [w for w in _plugin_lines(done.stderr, 0, "WARNING") if told in w]
    assert _plugin_lines(done.stderr, 1, "WARNING") == []
    left = {(e.rank, e.reason) for e in events(url, "compile_failure")}
    assert left == {(0, "another rank did not set up")}, left
    # the record counted the run that skipped on it (`payback.RETRY_AFTER`): rank 1's own cache, nobody else's
    [record] = (tmp_path / "rank1" / "cache" / "setups").glob("*.json")
    assert json.loads(record.read_text())["measured"]["skips"] == 1
