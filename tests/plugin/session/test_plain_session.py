"""Plain `tf.compat.v1.Session` loops are stitched under auto-attach, or their telemetry says why not.

Issue 30 item 4: only MonitoredSession was hooked, so a hand-written Session loop (Horovod's word2vec
example) got nothing, and nothing said so. Each case runs in a fresh interpreter, as a job does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from stitchfleet.plugin.setup import payback
from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry import spool_ingest
from tests.shared_cache import kernel_cache

pytestmark = pytest.mark.tf
ROOT = Path(__file__).resolve().parents[3]
JOB = Path(__file__).resolve().parents[1] / "plain_session_job.py"
STEPS = 16


def _run(tmp: Path, enabled: str, *extra: str, share: str | None = "0") -> dict[str, str]:
    """The job in a fresh interpreter; `share`: STITCHFLEET_SETUP_SHARE (0: the hook begins at the first training
    run; None: the default, which defers a plain session's setup by its cold fixed cost over SETUP_SHARE)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_")}
    env.update(
        PYTHONPATH=str(ROOT),
        STITCHFLEET_ENABLED=enabled,
        STITCHFLEET_STATE_DIR=str(tmp),
        STITCHFLEET_CACHE_DIR=str(kernel_cache()),
        STITCHFLEET_JOB_UID="plain",
        STITCHFLEET_WARMUP_STEPS="1",
        STITCHFLEET_BASELINE_STEPS="2",
        STITCHFLEET_SLOWDOWN_MARGIN="1000",
        STITCHFLEET_PROBE_STEPS="0",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    if share is not None:
        env["STITCHFLEET_SETUP_SHARE"] = share
    command = [sys.executable, str(JOB), str(STEPS), *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)


def _loaded(tmp: Path) -> None:
    """The job's spooled rows into its database, as `stitchfleet report` loads them before it reads (a job that ran
    as written without setting up has no database client: `Ledger.spool_meanwhile`)."""
    spool_ingest.claim(tmp / "spool", f"sqlite:///{tmp / 'telemetry.db'}")


def _events(tmp: Path, kind: str) -> list[str]:
    _loaded(tmp)
    engine = sa.create_engine(f"sqlite:///{tmp / 'telemetry.db'}")
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.select(tables.Event.detail).where(tables.Event.kind == kind)).all()
    finally:
        engine.dispose()
    return [row[0] for row in rows]


def _windows(tmp: Path) -> int:
    _loaded(tmp)
    engine = sa.create_engine(f"sqlite:///{tmp / 'telemetry.db'}")
    try:
        with engine.connect() as connection:
            return int(connection.execute(sa.select(sa.func.sum(tables.StepWindow.iterations))).scalar() or 0)
    finally:
        engine.dispose()


def test_a_plain_session_loop_is_stitched_and_trains_as_written(tmp_path: Path) -> None:
    on = _run(tmp_path, "1")
    off = _run(tmp_path / "off", "0")
    assert on["attached"] == "True" and off["attached"] == "False"
    assert int(on["calls"]) > 0, "stitched kernels ran"
    assert on["steps"] == str(STEPS)  # the eval runs are not training steps
    assert _windows(tmp_path) == STEPS
    assert [float(v) for v in on["losses"].split()] == pytest.approx(
        [float(v) for v in off["losses"].split()], rel=1e-4
    )


@pytest.mark.parametrize("how", ["finalize", "supervisor"])
def test_a_finalized_graph_says_not_attached(tmp_path: Path, how: str) -> None:
    """`supervisor`: tf.train.Supervisor finalizes the graph before its session (the corpus' PTB tutorial)."""
    out = _run(tmp_path, "1", how)
    off = _run(tmp_path / "off", "0", how)
    assert out["attached"] == "False" and "finalized" in out["reason"]
    assert any("finalized" in detail for detail in _events(tmp_path, "not_attached"))
    assert out["losses"] == off["losses"]  # the job computes what it computes without the plugin


def _job_rows(tmp: Path, *columns: Any) -> list[tuple[Any, ...]]:
    """The job records' `columns`, once the spooled rows are loaded."""
    _loaded(tmp)
    engine = sa.create_engine(f"sqlite:///{tmp / 'telemetry.db'}")
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.select(*columns)).all()]
    finally:
        engine.dispose()


def _devices(tmp: Path) -> list[tuple[Any, ...]]:
    return _job_rows(tmp, tables.Job.device_kind, tables.Job.devices_per_rank)


def _jobs(tmp: Path) -> list[tuple[Any, ...]]:
    return _job_rows(tmp, tables.Job.status, tables.Job.reason)


def test_a_job_of_unknown_length_runs_as_written_until_its_setup_can_pay(tmp_path: Path) -> None:
    """Issue 29 item 4: Horovod's word2vec loop (3000 steps, 4.4 s plain) paid 6 s of setup at its first training
    run and ran 15-16 s: a plain session cannot say how long it runs. Now it trains as written for SETUP_SHARE's
    deferral (the cold fixed cost over SETUP_SHARE 10%) first; this 16-step job ends long before, untouched, and its
    telemetry says so."""
    on = _run(tmp_path, "1", share=None)
    off = _run(tmp_path / "off", "0")
    assert on["attached"] == "False" and on["waiting"] == "True"
    assert on["calls"] == "0" and on["losses"] == off["losses"]
    # Light while it waits: the hook and the compiler were imported all the same (0.24 s of CPU), through the
    # mark a plain session reads on its first run; and the database client (0.3-0.4 s) for its two rows, which
    # now wait in the spool (read back below as `stitchfleet report` does)
    assert on["imported"] == "", on["imported"]
    assert list((tmp_path / "spool").glob("*.jsonl")), "the job's rows are in the spool"
    details = _events(tmp_path, "setup")
    waits = f"the job's length is unknown: it trains as written for {payback.fixed_seconds('cpu') / 0.1:.0f} s"
    assert any(d.startswith(waits) for d in details), details
    assert any(f"ended after {STEPS} training steps" in d for d in details), details
    assert _jobs(tmp_path) == [("finished", "setup skipped: job too short")]
    assert _devices(tmp_path) == [("cpu", os.cpu_count())], "measured, not the GPU default of an unmeasured job"


def test_a_job_of_unknown_length_sets_up_once_it_has_trained_long_enough(tmp_path: Path) -> None:
    """A deferral a clock passes at once (SETUP_SHARE 1e9: 10 ns): the hook begins at the second training run,
    mid-job, on the same telemetry record, and the job's losses stay plain TF's (dropout's stream included)."""
    on = _run(tmp_path, "1", share="1e9")
    off = _run(tmp_path / "off", "0")
    assert on["attached"] == "True" and on["waiting"] == "False"
    assert int(on["calls"]) > 0, "stitched kernels ran"
    assert on["steps"] == str(STEPS - 1)  # the first training run ran as written
    assert _windows(tmp_path) == STEPS - 1
    assert [float(v) for v in on["losses"].split()] == pytest.approx(
        [float(v) for v in off["losses"].split()], rel=1e-4
    )
    details = _events(tmp_path, "setup")
    assert any(d.startswith("the job's length is unknown: it trains as written for 0 s") for d in details), details
    assert len(_jobs(tmp_path)) == 1, "one job record: the one opened while it waited"


class _Hearing:
    """A hook that adds nothing to any run (as a quiet job's, or a baseline step's) and lists what it hears."""

    def __init__(self) -> None:
        self.heard: list[object] = []

    def before_run(self, context: Any) -> None:
        return None

    def after_run(self, context: Any, values: Any) -> None:
        self.heard.append(values.results)


def test_a_run_the_hook_adds_nothing_to_is_still_heard_after_it(tmp_path: Path) -> None:
    """Before session 47 the plain runner skipped `after_run` when `before_run` added nothing, so a quiet job's
    steps in a hand-written Session loop were never counted (its windows stopped), as MonitoredSession counts them."""
    import tensorflow as tf

    from stitchfleet.plugin.session.plain_session import PlainRunner

    graph = tf.Graph()
    with graph.as_default():
        value = tf.constant(3.0) * 2.0
        session = tf.compat.v1.Session(graph=graph)
    hook = _Hearing()
    runner = PlainRunner(session, hook, session.run)  # type: ignore[arg-type]
    try:
        assert [runner.run(value) for _ in range(3)] == [6.0, 6.0, 6.0]
    finally:
        session.close()
    assert hook.heard == [None, None, None]
