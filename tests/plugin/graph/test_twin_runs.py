"""The diverted run prepared once per run structure (`plugin.graph.twin_runs`), through the `Diverter`.

A small TF1 graph with a stand-in cluster (test_twin's): a run of dicts, lists and tuples of tensors and ops gives
what the plain path gives, in the caller's structure, with its run options and metadata, and TF builds no fetch
handler for it after it was prepared; whatever the prepared run does not take (a name, a namedtuple, a Python int
TF refuses, a shape its placeholder refuses, a session whose `run` is not TF's) runs the plain path, with TF's own
errors.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.client import session as tf_session

from stitchfleet.plugin.graph.twin import Diverter, NotRunnableError, build
from stitchfleet.plugin.graph.twin_mark import PREFIX
from stitchfleet.plugin.graph.twin_runs import UNPREPARED, PreparedRuns, _Feed
from tests.plugin.graph.test_twin import _attached, _feed, _model, _site

pytestmark = pytest.mark.tf
Pair = collections.namedtuple("Pair", ["loss", "step"])


def _handlers(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Counts the fetch handlers TF's `Session.run` builds from now on."""
    built: list[object] = []
    original = tf_session._FetchHandler.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(args[1])
        original(self, *args, **kwargs)

    monkeypatch.setattr(tf_session._FetchHandler, "__init__", counted)
    return built


def _executed(metadata: Any) -> set[str]:
    return {n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats}


def test_a_prepared_run_keeps_its_structure_options_and_metadata_and_builds_no_fetch_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _attached() as (model, session, diverter):
        fetches = {"caller": [model["loss"], model["train"]], "hook": {"pair": (model["act"], model["loss"])}}
        built = _handlers(monkeypatch)
        results = []
        for _ in range(3):
            diverter.armed = True
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)
            metadata = tf.compat.v1.RunMetadata()
            results.append(session.run(fetches, _feed(model), options=options, run_metadata=metadata))
            executed = _executed(metadata)
            assert any(name.startswith(f"{PREFIX}/") for name in executed) and "train" not in executed
        assert built == []  # prepared at the first step: TF's fetch handling is never rebuilt
        assert diverter.failure is None and session.run(model["step"]) == 3
    for out in results:
        assert list(out) == ["caller", "hook"] and isinstance(out["caller"], list) and out["caller"][1] is None
        assert isinstance(out["hook"]["pair"], tuple) and out["hook"]["pair"][1] == out["caller"][0]
        assert out["hook"]["pair"][0].shape == (5, 3)
    assert results[0]["caller"][0] != results[-1]["caller"][0]  # the copy trained: its loss moved


def test_the_prepared_run_gives_what_the_plain_path_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    losses: dict[bool, list[float]] = {}
    for prepared in (True, False):
        graph, model = _model()
        twin = build(graph, [_site(model["act"].op)])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(model["init"])
            diverter = Diverter(twin)
            if not prepared:  # as though the session's `run` were not TF's own: every run the plain path's
                monkeypatch.setattr(PreparedRuns, "takes", staticmethod(lambda session, own: False))
            built = _handlers(monkeypatch)
            diverter.attach(session)
            losses[prepared] = []
            for _ in range(4):
                diverter.armed = True
                value, _ = session.run([model["loss"], model["train"]], _feed(model))
                losses[prepared].append(float(value))
            assert len(built) == (0 if prepared else 4)
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-6)


def test_what_the_prepared_run_does_not_take_runs_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, model = _model()
    twin = build(graph, [_site(model["act"].op)])
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(model["init"])
        prepared = PreparedRuns(twin, session)
        feeds = _feed(model)
        assert prepared.run(Pair(model["loss"], model["step"]), feeds, None, None) is UNPREPARED  # a namedtuple
        assert prepared.run(["loss:0", model["train"]], feeds, None, None) is UNPREPARED  # a name
        assert prepared.run([model["loss"]], {"x:0": feeds[model["x"]]}, None, None) is UNPREPARED  # a named feed
        assert prepared.run([model["loss"]], {model["x"]: feeds[model["x"]].tolist()}, None, None) is UNPREPARED
        assert prepared.run([model["loss"]], {model["x"]: np.ones((5, 2), np.float32)}, None, None) is UNPREPARED
        assert prepared.run([model["loss"]], {model["loss"]: 1.0}, None, None) is UNPREPARED  # a feed into the copy
        assert session.run(model["step"]) == 0  # nothing ran
        done = prepared.run((model["loss"],), {model["x"]: np.ones((7, 4), np.float32)}, None, None)
        assert isinstance(done, tuple) and done[0].shape == ()  # a None dim takes any size
        diverter = Diverter(twin)
        diverter.attach(session)
        diverter.armed = True
        with pytest.raises(ValueError, match="Cannot feed value of shape"):  # TF's own error, as before
            session.run(model["loss"], {model["x"]: np.ones((5, 2), np.float32)})
        assert isinstance(diverter.failure, ValueError)
    assert not PreparedRuns.takes(object(), None)
    with tf.compat.v1.Session(graph=graph) as other:
        assert PreparedRuns.takes(other, other.run) and not PreparedRuns.takes(other, lambda *args: None)


def test_a_run_the_copy_declines_is_declined_every_time() -> None:
    with _attached() as (model, session, diverter):
        for _ in range(2):  # the second from what the first prepared: still declined, still run as written
            diverter.armed = True
            assert session.run(model["loss"], {model["loss"]: 2.0}) == 2.0
            assert isinstance(diverter.failure, NotRunnableError)
            diverter.failure = None


def test_diverts_is_answered_from_the_identity_of_its_fetched_ops_and_feed_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph, model = _model()
    twin = build(graph, [_site(model["act"].op)])
    fetched, walks = [model["train"], model["loss"].op], []
    original = twin._fed

    def walked(feeds: Any) -> Any:
        walks.append(feeds)
        return original(feeds)

    monkeypatch.setattr(twin, "_fed", walked)
    for _ in range(3):
        assert twin.diverts(_feed(model), fetched)
        assert not twin.diverts({model["loss"]: 1.0}, fetched)
    assert len(walks) == 2  # once per (fetched ops, feed keys)
    assert twin.diverts(_feed(model), list(fetched)) and len(walks) == 3  # another list: worked out anew


def test_fetched_variables_and_a_global_step_increment_are_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a run fetching a `tf.Variable`, or the `_UnreadVariable` that `tf.compat.v1.assign_add` returns on
    a resource variable (jobs fetch their global step's increment every step), was left to the plain path at every
    step: TF's fetch handling rebuilt each time, 150-250 us of a stitched step. Prepared now, with TF's values."""
    values: dict[bool, list[list[Any]]] = {}
    for prepared in (True, False):
        graph, model = _model()
        with graph.as_default():
            counter = tf.compat.v1.get_variable("counter", [], tf.int64, tf.compat.v1.zeros_initializer())
            up = tf.compat.v1.assign_add(counter, 1)
            fixed = tf.compat.v1.get_variable("fixed", [2], tf.float32, tf.compat.v1.ones_initializer())  # no update
            init = tf.compat.v1.variables_initializer([counter, fixed])
        assert not isinstance(up, (tf.Tensor, tf.Operation))  # what a resource variable's update returns
        twin = build(graph, [_site(model["act"].op)])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([model["init"], init])
            diverter = Diverter(twin)
            if not prepared:
                monkeypatch.setattr(PreparedRuns, "takes", staticmethod(lambda session, own: False))
            diverter.attach(session)
            built = _handlers(monkeypatch)
            values[prepared] = []
            for _ in range(3):
                diverter.armed = True
                loss, _, count, ones = session.run([model["loss"], model["train"], up, fixed], _feed(model))
                values[prepared].append([float(loss), int(count), ones])
                assert diverter.failure is None
            assert len(built) == (0 if prepared else 3)
            assert session.run(counter) == 3 and session.run(model["step"]) == 3
    for mine, theirs in zip(values[True], values[False], strict=True):
        assert mine[1] == theirs[1]
        np.testing.assert_allclose(mine[0], theirs[0], rtol=1e-6)
        np.testing.assert_array_equal(mine[2], theirs[2])
    assert [count for _, count, _ in values[True]] == [1, 2, 3] and values[True][0][2].tolist() == [1.0, 1.0]


def test_a_python_int_feed_is_taken_when_its_dtype_holds_it() -> None:
    """A Python int fed (a step counter, a batch size) left every step to the plain path; it is converted as TF
    converts it when its dtype holds it exactly, else left to TF's own check, which raises."""
    small = _Feed(None, np.int32, ())
    assert small.value(3) is not None and small.value(3).dtype == np.int32 and small.value(3) == 3
    assert small.value(2**40) is None and small.value(-(2**31)) == -(2**31)
    assert _Feed(None, np.float32, ()).value(3) == 3.0
    assert _Feed(None, np.float32, (2,)).value(3) is None  # the shape refused: TF's error
    assert _Feed(None, np.object_, ()).value(3) is None  # a string feed: TF's own conversion


def test_runs_left_to_tfs_fetch_handling_are_counted_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A job whose every stitched step misses the prepared path pays ~0.2 ms a step without a word (session 22: the
    global step's increment); the diverter counts such runs and logs the first, with what the run held."""
    with _attached() as (model, session, diverter):
        caplog.set_level("INFO", logger="stitchfleet.plugin")
        for _ in range(3):
            diverter.armed = True
            session.run(Pair(model["loss"], model["train"]), _feed(model))  # a namedtuple: the plain path
        diverter.armed = True
        session.run([model["loss"], model["train"]], _feed(model))
        assert diverter.unprepared == 3 and diverter.failure is None
    said = [r.getMessage() for r in caplog.records if "TF's own fetch handling" in r.getMessage()]
    assert len(said) == 1 and "fetches Pair" in said[0] and "ndarray" in said[0]


def test_a_fetched_tensor_that_is_also_fed_gets_its_fed_value_as_from_tf(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check step fetches its clusters' inputs, fed placeholders among them: TF gives those the fed value (after its
    conversion) and computes nothing for them. The prepared run did not take such a run (TF's fetch handling for ~300
    fetches on each of the demo's check steps)."""
    with _attached() as (model, session, diverter):
        given = [[1, 2, 3, 4]] * 5  # a list: converted to float32 as TF converts it
        fetches = {"caller": [model["loss"], model["train"]], "check": [(model["x"], model["act"]), [model["x"]]]}
        feeds = {model["x"]: np.asarray(given, np.float64)}
        diverter.armed = False
        plain = session.run(fetches, feeds)
        built = _handlers(monkeypatch)
        diverter.armed = True
        done = session.run(fetches, feeds)
        assert built == [] and diverter.failure is None
        x = done["check"][0][0]
        assert x.dtype == np.float32 and x.shape == (5, 4) and done["check"][1][0] is not None
        np.testing.assert_array_equal(x, plain["check"][0][0])
        np.testing.assert_array_equal(done["check"][1][0], x)
        assert isinstance(done["check"][0], tuple) and done["check"][0][1].shape == (5, 3)
        assert session.run(model["step"]) == 2
