"""rows: validation names the bad field; every row type survives the JSON round trip."""

from __future__ import annotations

import datetime as dt

import pytest

from stitchfleet import settings
from stitchfleet.telemetry import rows as r
from tests.telemetry.workload import job_key, workload


def test_json_round_trip_of_every_row_type() -> None:
    # The operator's form of a pod's cluster verdict and a rank's plugin overhead complete the set.
    extra = [r.JobVerdict(job_key(), "fp-ln-bwd", "reverted", "mismatch", 7), r.JobOverhead(job_key(), 1, 0.25)]
    rows = [*workload(windows=12, ranks=2), *extra]
    assert {type(row).__name__ for row in rows} == set(r.ROW_TYPES)
    assert [r.from_json(r.to_json(row)) for row in rows] == rows


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: r.StepWindow(job_key(), 0, 0, 10, 5, 1, "stitched", 1.0), "last_step=5 < first_step=10"),
        (lambda: r.StepWindow(job_key(), 0, 0, 0, 9, 10, "turbo", 1.0), "mode='turbo': expected one of"),
        (lambda: r.StepWindow(job_key(), 0, 0, 0, 9, 10, "stitched", float("nan")), "step_seconds_sum=nan"),
        (lambda: r.JobFinished(job_key(), "done"), "status='done'"),
        (lambda: r.JobOverhead(job_key(), 0, -0.5), "overhead_seconds=-0.5: expected a value >= 0.0"),
        (lambda: r.JobStarted(job_key(), rank=2, world_size=2), "rank=2 is not below world_size=2"),
        (lambda: r.JobStarted(job_key(), started_at=dt.datetime(2026, 1, 1)), "started_at=.*needs a timezone"),
        (lambda: r.JobKey("c", "ns", "", "u"), "job_name is empty"),
        (lambda: r.ClusterVerdict("fp", "maybe"), "verdict='maybe'"),
    ],
)
def test_bad_rows_name_the_field(make: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make()  # type: ignore[operator]


def test_unknown_row_type_in_json() -> None:
    with pytest.raises(ValueError, match="unknown row type 'Bogus'"):
        r.from_json({"type": "Bogus"})


def test_job_key_from_settings() -> None:
    current = settings.load({"STITCHFLEET_JOB_NAME": "bert", "STITCHFLEET_NAMESPACE": "nlp"})
    with pytest.raises(ValueError, match="STITCHFLEET_JOB_UID"):
        r.JobKey.from_settings(current)
    uid = r.new_job_uid()
    assert r.JobKey.from_settings(current, uid) == r.JobKey("local", "nlp", "bert", uid)
    pinned = settings.load({"STITCHFLEET_JOB_UID": "abc-1"})
    assert r.JobKey.from_settings(pinned, uid).job_uid == "abc-1"
