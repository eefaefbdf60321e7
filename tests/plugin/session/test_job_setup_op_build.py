"""A setup that waits for the native op's build counts the wait among what the cache spares its next run.

Session 47: a cold run on a node without the shim's prebuilt op built the op (~10 s) inside its setup and told its
next run that a warm run pays that again ("paid 15.8 s a warm run pays again"), so the warm runs after it skipped
their setup. The op's build is here a slow `choose_bridge` after `dispatch_op.warm` said a build was under way.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stitchfleet.plugin.native import dispatch_op
from stitchfleet.plugin.session import job_setup
from stitchfleet.plugin.setup import selection
from tests.plugin.hook_harness import hooked, train

pytestmark = pytest.mark.tf
BUILD_SECONDS = 3.0  # the op's build as this test stands it in: beyond a warm setup's translation checks


def _second_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, building: bool) -> job_setup.Setup:
    """A warm setup (every kernel in the shared cache after a first job) whose bridge takes BUILD_SECONDS to choose:
    the op's build this setup started (`building`), or a slow load of an op that was there."""
    train(3, hooked(tmp_path / "first", f"op-first-{building}")[0])
    chosen = job_setup.choose_bridge

    def slow(setting: str, backend: str, cache_dir: Path) -> dispatch_op.BridgeOp | None:
        time.sleep(BUILD_SECONDS)
        return chosen(setting, backend, cache_dir)

    monkeypatch.setattr(selection.dispatch_op, "warm", lambda cache_dir: building)
    monkeypatch.setattr(job_setup, "choose_bridge", slow)
    hook, _ = hooked(tmp_path / "second", f"op-second-{building}")
    train(3, hook)
    assert hook.setup is not None and hook.setup.warm  # no kernel compiled: only the op's build can be spared
    return hook.setup


def test_the_wait_for_an_op_this_setup_built_is_spared_by_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _second_setup(tmp_path, monkeypatch, building=True).cold_seconds >= BUILD_SECONDS


def test_a_setup_that_found_the_op_spares_no_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _second_setup(tmp_path, monkeypatch, building=False).cold_seconds < BUILD_SECONDS  # a warm run pays it
