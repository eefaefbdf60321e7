"""store: how several writers' JobStarted rows merge into one jobs row, in any order.

A job is described by its ranks (the plugin, with the identity the webhook injected) and by the
operator watching its pods (labels and pod counts, no GPU type). An empty team, model or GPU
type means "not known" and never overwrites a stored value; the largest world size wins; the
earliest start wins; rank 0's pod names the job. Checked on SQLite and PostgreSQL (their ON
CONFLICT clauses differ), with the rows in separate transactions and within one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from typing import Any

from sqlalchemy import select

from stitchfleet.telemetry import database, models, store
from stitchfleet.telemetry.rows import JobKey, JobStarted
from tests.telemetry.workload import T0, job_key

COLUMNS = ("team", "model", "gpu_type", "world_size", "pod_name", "started_at")


def plugin_rank(rank: int, *, world_size: int = 8, team: str = "vision", gpu_type: str = "H200") -> JobStarted:
    """A rank's own row: the identity the webhook injected, the world size Horovod reports."""
    started = T0 + dt.timedelta(seconds=30 + rank)
    return JobStarted(
        job_key(),
        rank=rank,
        team=team,
        model="resnet50",
        pod_name=f"resnet-train-{rank}",
        world_size=world_size,
        gpus_per_rank=4,
        gpu_type=gpu_type,
        started_at=started,
    )


def operator_view(known_pods: int, *, team: str = "", model: str = "") -> JobStarted:
    """The operator's row: labels (maybe none), the pods it has seen so far, no GPU type."""
    return JobStarted(
        job_key(),
        rank=known_pods - 1,
        team=team,
        model=model,
        pod_name=f"resnet-train-{known_pods - 1}",
        world_size=known_pods,
        gpus_per_rank=4,
        started_at=T0,
    )


def write(url: str, batches: list[list[JobStarted]]) -> None:
    engine = database.connect(url)
    try:
        for batch in batches:
            with engine.begin() as connection:
                store.write_rows(connection, batch)
    finally:
        engine.dispose()


def stored(url: str, key: JobKey) -> dict[str, Any]:
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            job = models.Job
            query = select(*(getattr(job, name) for name in COLUMNS)).where(job.job_uid == key.job_uid)
            rows = connection.execute(query).all()
    finally:
        engine.dispose()
    assert len(rows) == 1, f"one jobs row per key, found {len(rows)}"
    return dict(zip(COLUMNS, rows[0], strict=True))


def test_every_order_of_the_writers_gives_the_same_job(any_url: str) -> None:
    database.upgrade(any_url)
    rows = [operator_view(1), plugin_rank(1), operator_view(2), plugin_rank(0), operator_view(3, team="vision")]
    expected = {
        "team": "vision",
        "model": "resnet50",
        "gpu_type": "H200",
        "world_size": 8,
        "pod_name": "resnet-train-0",
        "started_at": T0,
    }
    for number, order in enumerate(itertools.islice(itertools.permutations(rows), 0, None, 17)):
        key = job_key(f"run-{number}")
        write(any_url, [[dataclasses.replace(row, job=key)] for row in order])
        assert stored(any_url, key) == expected, f"writers in the order {order}"


def test_an_empty_text_never_overwrites_a_stored_one(any_url: str) -> None:
    database.upgrade(any_url)
    write(any_url, [[plugin_rank(0)], [operator_view(2)], [plugin_rank(1, team="", gpu_type="")]])
    got = stored(any_url, job_key())
    assert (got["team"], got["model"], got["gpu_type"]) == ("vision", "resnet50", "H200")


def test_a_later_known_text_fills_what_was_empty(any_url: str) -> None:
    database.upgrade(any_url)
    # The operator came first and the pods carry no team label; the ranks know team and GPU type.
    write(any_url, [[operator_view(1)], [plugin_rank(1, team="vision")]])
    got = stored(any_url, job_key())
    assert (got["team"], got["model"], got["gpu_type"]) == ("vision", "resnet50", "H200")


def test_the_largest_world_size_wins_even_within_one_transaction(any_url: str) -> None:
    database.upgrade(any_url)
    # The operator has seen 2 pods when the ranks report 8; then it sees the third pod.
    write(any_url, [[operator_view(2), plugin_rank(3), operator_view(3)]])
    assert stored(any_url, job_key())["world_size"] == 8
    write(any_url, [[operator_view(1)]])
    assert stored(any_url, job_key())["world_size"] == 8, "a smaller count later never shrinks the job"


def test_the_earliest_start_and_rank_zeros_pod_win(any_url: str) -> None:
    database.upgrade(any_url)
    write(any_url, [[plugin_rank(0)], [plugin_rank(5)], [operator_view(4)]])
    got = stored(any_url, job_key())
    assert got["started_at"] == T0, "the operator saw the first pod start before any rank wrote"
    assert got["pod_name"] == "resnet-train-0", "only rank 0 names the job once it is named"
