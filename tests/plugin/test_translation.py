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
