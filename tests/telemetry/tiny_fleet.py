"""A tiny fleet whose weekly report is worked out by hand (week 2026-W47: Nov 16-22, 2026).

- A  vision/resnet-a run-1: 1 rank x 1 GPU, starts Tue, compile 30 s; one baseline window
     (0.2 s/step) and four stitched windows (0.16, 0.15, 0.17, 0.14 s/step) saving 40+50+30+60 s.
- A2 vision/resnet-a run-2: a second run of the same job (Fri), one stitched window saving 36 s.
- B  nlp/bert-b: 4 ranks x 2 GPUs, starts Mon, compile 15/20/18/12 s by rank (20 s counts);
     per rank a baseline window (0.5 s/step) and a stitched one (0.4 s/step) saving 50 s; rank 3
     one more stitched window (0.4 s/step, saving 50 s), so the busiest rank ran 1500 iterations.
- C  vision/vit-c: 2 ranks x 1 GPU, starts Sun 22:00, compile 40 s; per rank a baseline and a
     stitched window (saving 20 s) in W47, then a stitched window (saving 20 s) and a reverted
     one in W48; two revert events (numeric_mismatch first, then nan); status reverted.
- D  vision/old-d: entirely in W46, absent from W47.
"""

from __future__ import annotations

import datetime as dt
import uuid

from stitchfleet.telemetry import database, store
from stitchfleet.telemetry import rows as r


def at(day: int, hour: int, minute: int = 0) -> dt.datetime:
    """An instant of November 2026, UTC."""
    return dt.datetime(2026, 11, day, hour, minute, tzinfo=dt.UTC)


def key(namespace: str, name: str, uid: str = "run-1") -> r.JobKey:
    return r.JobKey("gpu-east", namespace, name, uid)


A, A2 = key("vision", "resnet-a"), key("vision", "resnet-a", "run-2")
B, C, D = key("nlp", "bert-b"), key("vision", "vit-c"), key("vision", "old-d")


def window(
    where: tuple[r.JobKey, int, int], when: dt.datetime, figures: tuple[int, float, float], mode: str
) -> r.StepWindow:
    """Window `index` of `rank` of `job`, (iterations, step seconds sum, saved seconds)."""
    job, rank, index = where
    iterations, total, saved = figures
    reference = None if mode == "baseline" else {A: 0.2, A2: 0.2, B: 0.5, C: 0.5, D: 0.2}[job]
    first = index * iterations
    return r.StepWindow(
        job, rank, index, first, first + iterations - 1, iterations, mode, total, reference, saved, recorded_at=when
    )


def _started(job: r.JobKey, when: dt.datetime, labels: tuple[str, str], ranks: int, gpus: int) -> list[r.Row]:
    team, model = labels
    return [r.JobStarted(job, rank, team, model, f"pod-{rank}", ranks, gpus, "H200", when) for rank in range(ranks)]


def _job_a() -> list[r.Row]:
    rows: list[r.Row] = [*_started(A, at(17, 10), ("ml", "resnet50"), 1, 1), r.JobCompiled(A, 0, 30.0)]
    rows.append(window((A, 0, 0), at(17, 10, 5), (1000, 200.0, 0.0), "baseline"))
    stitched = [
        (at(17, 11), 160.0, 40.0),
        (at(18, 9), 150.0, 50.0),
        (at(18, 10), 170.0, 30.0),
        (at(18, 11), 140.0, 60.0),
    ]
    for index, (when, total, saved) in enumerate(stitched, start=1):
        rows.append(window((A, 0, index), when, (1000, total, saved), "stitched"))
    rows.append(r.JobFinished(A, "finished", ended_at=at(18, 12)))
    rows += [
        *_started(A2, at(20, 8), ("ml", "resnet50"), 1, 1),
        window((A2, 0, 0), at(20, 9), (100, 16.0, 36.0), "stitched"),
    ]
    return rows


def _job_b() -> list[r.Row]:
    rows = _started(B, at(16, 8), ("nlp", "bert"), 4, 2)
    for rank, seconds in enumerate((15.0, 20.0, 18.0, 12.0)):
        rows.append(r.JobCompiled(B, rank, seconds))
        rows.append(window((B, rank, 0), at(16, 9), (500, 250.0, 0.0), "baseline"))
        rows.append(window((B, rank, 1), at(16, 10), (500, 200.0, 50.0), "stitched"))
    rows.append(window((B, 3, 2), at(16, 11), (500, 200.0, 50.0), "stitched"))
    return rows + [r.JobFinished(B, "finished", rank=rank, ended_at=at(16, 12)) for rank in range(4)]


def _job_c() -> list[r.Row]:
    rows = [*_started(C, at(22, 22), ("ml", "vit"), 2, 1), r.JobCompiled(C, 0, 40.0)]
    for rank in range(2):
        rows.append(window((C, rank, 0), at(22, 22, 30), (200, 100.0, 0.0), "baseline"))
        rows.append(window((C, rank, 1), at(22, 23, 30), (200, 80.0, 20.0), "stitched"))
        rows.append(window((C, rank, 2), at(23, 0, 30), (200, 80.0, 20.0), "stitched"))
        rows.append(window((C, rank, 3), at(23, 1), (200, 100.0, 0.0), "reverted"))
    for minute, reason in ((40, "numeric_mismatch"), (50, "nan")):
        event_id = str(uuid.UUID(int=minute))
        rows.append(r.Event(C, "revert", 0, 2 * 200, "fp-ln", reason, occurred_at=at(23, 0, minute), uuid=event_id))
    return [*rows, r.JobFinished(C, "reverted", "cluster fp-ln: numeric mismatch", ended_at=at(23, 2))]


def _job_d() -> list[r.Row]:
    rows = [*_started(D, at(10, 8), ("ml", "resnet50"), 1, 1), r.JobCompiled(D, 0, 30.0)]
    return [*rows, window((D, 0, 0), at(10, 9), (100, 20.0, 99.0), "stitched")]


def fleet() -> list[r.Row]:
    """Every row of the tiny fleet."""
    return _job_a() + _job_b() + _job_c() + _job_d()


def write_fleet(url: str) -> None:
    """Migrates `url` and writes the tiny fleet into it."""
    database.upgrade(url)
    engine = database.connect(url)
    try:
        with engine.begin() as connection:
            store.write_rows(connection, fleet())
    finally:
        engine.dispose()
