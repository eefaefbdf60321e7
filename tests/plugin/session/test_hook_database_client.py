"""A job that sets up opens its database client beside its setup, and `begin` waits for it: the client's seconds
(its imports, a fresh database's schema) are the setup's, booked, and its Python does not run beside TF's session
creation. Regression (session 41): opened after the setup's seconds were taken, the client's thread held the GIL
against TF's many short C calls while the session was created (BERT's Scaffold.finalize 0.88 s against 0.32 s), which
cost the run 0.6 s more than the client itself, and the report never booked it."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.fleet.ledger import Ledger
from tests.plugin.hook_harness import hooked
from tests.plugin.recorded_events import events

pytestmark = pytest.mark.tf
DELAY = 0.5  # a client this slow to open: its wait shows in the setup's seconds


def test_begin_returns_with_its_client_open_and_books_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[float] = []
    open_client = Ledger._open

    def slow_open(self: Ledger) -> None:
        time.sleep(DELAY)
        open_client(self)
        opened.append(time.perf_counter())

    monkeypatch.setattr(Ledger, "_open", slow_open)
    hook, url = hooked(tmp_path, "client")
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook.begin()
    returned = time.perf_counter()
    assert hook.installed and hook.ledger is not None
    assert opened and opened[0] <= returned, "begin returned before its database client was open"
    assert not [t for t in threading.enumerate() if t.name == "stitchfleet-telemetry-open"]
    assert hook._setup_seconds >= DELAY  # the wait is the setup's
    hook.ledger.close()
    [booked] = [m for e in events(url, "setup") if (m := re.fullmatch(r"setup (\d+\.\d+) s", e.reason))]
    assert float(booked.group(1)) >= DELAY
