"""translation: a cluster's IR is checked against TF's own ops before it is installed."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler.ir import Op
from stitchfleet.plugin.frontend import elementwise
from tests.plugin.hook_harness import events, hooked, train

pytestmark = pytest.mark.tf


def test_every_cluster_of_a_faithful_translation_passes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook, _ = hooked(tmp_path, "faithful")
    with caplog.at_level(logging.INFO, logger="stitchfleet.plugin"):
        train(2, hook)
    assert len(hook.installed) == 12 and not hook.off
    # every cluster was really checked (gradient clusters read folded shapes and ordering edges)
    assert "translation check skipped" not in caplog.text


def test_a_mistranslated_op_is_refused_with_the_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The frontend reads Erf as Tanh: the IR, the kernel and the guard's fp64 reference all agree with
    # each other, and only TF's own ops can tell that the BERT FFN's GELU is now wrong.
    monkeypatch.setitem(elementwise.UNARY, "Erf", Op.TANH)
    hook, url = hooked(tmp_path, "mistranslated")
    run = train(8, hook)
    refused = {k: v for k, v in hook.off.items() if v.startswith("translation differs from TF")}
    assert refused, hook.off
    assert all("allowed)" in reason for reason in refused.values())
    installed = {c.index for c, _ in hook.installed}
    assert installed and not installed & set(refused)
    assert {e.reason for e in events(url, "compile_failure")} >= {"translation differs from TF"}
    assert np.isfinite(run.losses).all()


def test_the_check_can_be_switched_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(elementwise.UNARY, "Erf", Op.TANH)
    hook, _ = hooked(tmp_path, "unchecked", STITCHFLEET_TRANSLATION_CHECK="false")
    train(2, hook)
    assert not any(v.startswith("translation") for v in hook.off.values())


@pytest.mark.slow  # a fresh kernel cache: the first pod compiles its 12 clusters
def test_a_second_pod_of_the_job_reuses_the_passed_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchfleet.plugin import translation

    cache = {"STITCHFLEET_CACHE_DIR": str(tmp_path / "cache")}
    first, _ = hooked(tmp_path / "one", "first-pod", **cache)
    train(1, first)
    assert len(list((tmp_path / "cache" / "translation").glob("*.ok"))) == 12

    def not_again(*args: object) -> None:
        raise AssertionError("a passed check ran again")

    monkeypatch.setattr(translation, "_check", not_again)
    second, _ = hooked(tmp_path / "two", "second-pod", **cache)
    train(1, second)
    assert len(second.installed) == 12
