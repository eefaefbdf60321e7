"""A job the fleet knows loses (`setup/job_verdict.py`): what a job's end says, and the next run skipping setup.

The findings: a group measured not faster with stitching off, or a slowdown revert, say "slower"; clusters kept
to the end say "faster"; a mismatch says nothing about speed. The hook (small BERT encoder, TF CPU, SQLite): with
two jobs' slower findings on this graph's key the next job compiles nothing and runs its own graph, one job's
finding changes nothing, and a later faster finding clears them (the mirror rule).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
import tensorflow as tf

from stitchfleet import settings
from stitchfleet.demo import models
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.job_course import JobCourse
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.setup import job_verdict
from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.kinds import ProbeOutcome
from tests.plugin.hook_harness import _feeds, events, hooked, train
from tests.telemetry.workload import write

pytestmark = pytest.mark.tf


def _course(tmp_path: Path, kept: bool | None = None) -> JobCourse:
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path), "STITCHFLEET_JOB_UID": "course"})
    ledger = Ledger(current, 0, 1, f"sqlite:///{tmp_path / 't.db'}")
    clusters = [Cluster(i, f"{i:032x}", SimpleNamespace(bad=None), 3, kept=kept) for i in range(2)]  # type: ignore[arg-type]
    return JobCourse(clusters, ledger)


def test_a_lost_group_with_stitching_off_is_a_slower_finding(tmp_path: Path) -> None:
    course = _course(tmp_path)
    course.switch_off(190, "per-cluster probes skipped", "group not faster, per-cluster probes skipped")
    found = job_verdict.finding(course, False, ProbeOutcome.SLOWER)  # the group's own finding: slower
    assert found == ("slower", "group not faster, per-cluster probes skipped")
    # stitching off without a measured group loss (e.g. every cluster reverted for a mismatch) is no speed finding
    assert job_verdict.finding(course, group_proven=None) is None


def test_a_group_within_its_noise_is_no_slower_finding(tmp_path: Path) -> None:
    """Session 36, read in an A/B's fleet: the demo's group measured 3.9% faster (-0.30 ms of 7.75, noise 0.17 ms
    after two reruns), not proven, so stitching went off; the group's own finding (`ProbeDecisions`) kept nothing,
    but the job's end told the fleet "slower" on its graph: one more such run and every later run skips its setup.
    Session 37: likewise a group slower within its noise (+0.01 ms, noise 0.41 ms). The job's verdict follows the
    group's own finding, which is none within the noise."""
    course = _course(tmp_path)
    course.switch_off(480, "per-cluster probes skipped", "group not faster, per-cluster probes skipped")
    assert job_verdict.finding(course, False, None) is None
    assert job_verdict.finding(course, False) is None  # not proven without figures (ranks lacking windows)


def test_a_slowdown_revert_is_slower_and_a_mismatch_revert_says_nothing(tmp_path: Path) -> None:
    slow = _course(tmp_path / "a", kept=True)
    slow.revert_job(300, "slowdown", "stitched 5.99 vs baseline 4.76 ms")
    assert job_verdict.finding(slow, group_proven=True) == ("slower", "slowdown: stitched 5.99 vs baseline 4.76 ms")
    wrong = _course(tmp_path / "b", kept=True)
    wrong.revert_job(12, "non-finite loss", "the loss was NaN/Inf on a stitched step")
    assert job_verdict.finding(wrong, group_proven=True) is None


def test_a_proven_group_kept_to_the_end_is_a_faster_finding(tmp_path: Path) -> None:
    assert job_verdict.finding(_course(tmp_path, kept=True), group_proven=True) == (
        "faster",
        "group proven faster, clusters kept to the job's end",
    )
    # kept without a measured group (probes off, or per-cluster probes only): nothing about the job's graph
    assert job_verdict.finding(_course(tmp_path / "a", kept=True), group_proven=None) is None
    assert job_verdict.finding(_course(tmp_path / "b", kept=None), group_proven=None) is None


def _job_findings(url: str, key: tuple[str, str, str], outcome: str, *uids: str) -> None:
    now = dt.datetime.now(dt.UTC)
    rows = [r.ProbeVerdict(r.JobKey("local", "default", "other", uid), *key, outcome, "job: lost", now) for uid in uids]
    write(url, rows)


def _setup_skipped(url: str, spool: Path) -> list[str]:
    """The skipped setups' details; a job that skips its setup spools its rows (`Ledger.spool_meanwhile`)."""
    return [e.detail for e in events(url, "setup", spool) if e.reason == "setup skipped: known to lose"]


def _job_outcomes(url: str) -> list[tuple[str, str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            found = connection.execute(sa.select(tables.ProbeVerdict.fingerprint, tables.ProbeVerdict.outcome))
            return [(fingerprint, outcome) for fingerprint, outcome in found if fingerprint.startswith("job:")]
    finally:
        engine.dispose()


def test_a_graph_the_fleet_found_slower_in_two_jobs_is_left_as_written(tmp_path: Path) -> None:
    first, url = hooked(tmp_path, "first")
    train(4, first)
    assert first.controller is not None and first.controller.clusters  # set up as usual
    assert first.job_key is not None and first.job_key[0].startswith("job:")
    key = first.job_key

    _job_findings(url, key, "slower", "lost-1")
    second, _ = hooked(tmp_path, "second")
    train(4, second)
    assert second.controller is not None and second.job_key == key  # one job's finding: set up as usual

    _job_findings(url, key, "slower", "lost-2")
    third, _ = hooked(tmp_path, "third")
    run = train(4, third)
    assert third.controller is None and not third.installed and third.shapes is None  # no compile, no twin
    assert len(run.losses) == 4
    (detail,) = _setup_skipped(url, tmp_path / "state" / "spool")
    assert detail.startswith("the fleet found stitching slower than TF on this job's graph: ")

    _job_findings(url, key, "faster", "kept-1")  # a later job kept its clusters: the slower verdict is cleared
    fourth, _ = hooked(tmp_path, "fourth")
    train(4, fourth)
    assert fourth.controller is not None and fourth.controller.clusters


def test_a_job_that_lost_records_it_under_its_graph_key_at_its_end(tmp_path: Path) -> None:
    hook, url = hooked(tmp_path, "recorder")
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(4):
                session.run([loss, train_op], feeds)
            assert hook.controller is not None and hook.job_key is not None
            # as a lost group probe leaves it (`ProbeCourse.after_group_loss`): the job's end then says so
            hook.controller.decisions.group_proven = False
            hook.controller.decisions.group_finding = ProbeOutcome.SLOWER  # stitched slower beyond the noise
            hook.controller.course.switch_off(3, "per-cluster probes skipped", "group not faster")
    assert _job_outcomes(url) == [(hook.job_key[0], "slower")]
