"""The collector around the hook's setup: off during it, then the setup's own cycles freed and the heap frozen, so that
no full collection of TF's and the setup's heap falls in a training step; the job's end thaws what begin froze.
Regression (session 49): after the MLP's setup, a full collection (0.18-0.19 s, ~320,000 objects) fell in one of the
job's steps in each of three runs (gc.callbacks), where plain TF's steps had none."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from stitchfleet.plugin.session import gc_pause


class Node:
    """An object that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: object = None


@pytest.fixture
def no_freeze() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc_pause.thawed()
    gc.unfreeze()


def test_the_setups_cycles_are_freed_when_it_ends(no_freeze: None) -> None:
    with gc_pause.paused():
        node = Node()
        node.other = node  # garbage once the block drops it, freed only by the collector
        dead = weakref.ref(node)
        del node
        assert dead() is not None  # the collector is off in the block
    assert dead() is None


def test_what_the_setup_leaves_is_frozen_until_the_hooks_end(no_freeze: None) -> None:
    with gc_pause.paused():
        kept = Node()
    assert gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # a full collection does not walk it
    gc_pause.thawed()
    assert gc.get_freeze_count() == 0
    assert any(obj is kept for obj in gc.get_objects())


def test_a_jobs_own_freeze_is_left_as_it_set_it(no_freeze: None) -> None:
    # Not by the freeze count: frozen objects that die (another thread's) lower it (a flaky CI run, session 49).
    marker = Node()
    gc.freeze()
    with gc_pause.paused():
        Node()
    gc_pause.thawed()
    assert not any(obj is marker for obj in gc.get_objects())  # still frozen: the job froze it


def test_a_job_without_the_collector_keeps_it_off_and_unfrozen(no_freeze: None) -> None:
    gc.disable()
    try:
        with gc_pause.paused():
            Node()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


@pytest.mark.tf
def test_a_hooked_sessions_heap_is_frozen_while_it_trains_and_thawed_at_its_close(
    no_freeze: None, tmp_path: Path
) -> None:
    import tensorflow as tf

    from stitchfleet.plugin.session.hook import StitchHook
    from tests.plugin.hook_harness import make_settings

    hook = StitchHook(make_settings(tmp_path, "frozen"), db_url=f"sqlite:///{tmp_path / 't.db'}")
    frozen: list[int] = []
    with tf.Graph().as_default():
        weight = tf.compat.v1.get_variable("w", [4], initializer=tf.compat.v1.zeros_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(weight**2), global_step=step)
        stop = tf.compat.v1.train.StopAtStepHook(num_steps=3)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook, stop]) as session:
            while not session.should_stop():
                session.run(train)
                frozen.append(gc.get_freeze_count())
    assert frozen and min(frozen) > 0  # every step ran with the heap its setup left frozen
    assert gc.get_freeze_count() == 0  # the session's close (the hook's end) thawed it
