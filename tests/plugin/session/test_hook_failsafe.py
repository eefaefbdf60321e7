"""Nothing the plugin does may fail the user's job: real failures injected into real code paths."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from stitchfleet.plugin.session.hook import StitchHook
from tests.plugin.hook_harness import events, hooked, make_settings, train

pytestmark = pytest.mark.tf


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_missing_backend_leaves_stitching_off_and_records_why(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    hook = StitchHook(make_settings(tmp_path, "no-backend"), backend="cuda", db_url=url)
    plain = train(8, None)
    run = train(8, hook)
    np.testing.assert_allclose(run.losses, plain.losses, rtol=1e-6)
    assert not hook.active and not hook.installed
    failures = events(url, "compile_failure")
    assert failures and "cuda bridge" in failures[0].detail


def test_a_setup_that_fails_before_its_ledger_is_recorded_and_the_job_runs_as_written(tmp_path: Path) -> None:
    # Regression: `begin` recorded a setup failure through the ledger only, and one raised before the ledger was
    # opened (Horovod's rank whose setup failed) left no row: the rank's telemetry had no table, no event.
    from stitchfleet.plugin.native.faults import Fault

    plain = train(6, None)
    hook, url = hooked(tmp_path, "setup-fails", Fault("setup", cluster=0, rank=0))
    run = train(6, hook)
    assert run.losses == plain.losses and not hook.active and not hook.installed
    failures = [e for e in events(url, "compile_failure") if "plugin setup failed" in e.reason]
    assert len(failures) == 1 and "injected setup failure" in failures[0].detail


def test_unreachable_database_does_not_stop_training(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://nobody@127.0.0.1:{_closed_port()}/none?connect_timeout=1"
    hook = StitchHook(make_settings(tmp_path, "db-down", STITCHFLEET_FLUSH_SECONDS="2"), backend="cpu", db_url=url)
    run = train(12, hook)
    assert len(run.losses) == 12 and all(np.isfinite(run.losses))
    assert hook.active and all(calls > 0 for calls in hook.backend_calls.values())
    assert hook.ledger is not None and hook.ledger.recorder.stats.spooled > 0


def test_a_bad_database_url_does_not_stop_training(tmp_path: Path) -> None:
    hook = StitchHook(make_settings(tmp_path, "bad-url"), backend="cpu", db_url="nosuchdialect://x")
    run = train(8, hook)
    assert len(run.losses) == 8 and hook.active


def test_raising_backend_step_falls_back_and_reverts(tmp_path: Path) -> None:
    from stitchfleet.plugin.native.faults import Fault

    hook, url = hooked(tmp_path, "raising", Fault("raise", cluster=0))
    plain = train(10, None)
    run = train(10, hook)
    # the failing step used the unfused numpy result, so training went on unchanged
    np.testing.assert_allclose(run.losses, plain.losses, rtol=2e-5)
    assert [e.reason for e in events(url, "revert")] == ["backend error: RuntimeError"]
