"""MonitoredTrainingSession as TF1 scripts use it: checkpoints, summaries, a step counter and a logging
hook beside the StitchHook. Those hooks read the global step through the cond_v2 read that
MonitoredTrainingSession adds, whose `If` output TF refuses to fetch.

Regression: the clusterer put the global-step read's `add` into an attention cluster, the hook fetched
its input on the first check step, TF raised InaccessibleTensorError and stitching reverted for the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import training_util

from stitchfleet.demo import models
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.mapping import StepOps
from stitchfleet.plugin.session.hook import StitchHook
from tests.plugin.hook_harness import hooked

pytestmark = pytest.mark.tf
v1 = tf.compat.v1
STEPS = 16


def _train(hook: StitchHook | None, checkpoints: Path) -> list[float]:
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        loss, train = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        step = v1.train.get_or_create_global_step()
        with tf.control_dependencies([train]):
            advance = v1.assign_add(step, 1)
        v1.summary.scalar("loss", loss)
        rng = np.random.default_rng(0)
        feeds: dict[Any, Any] = {}
        for name in ("input:0", "target:0"):
            tensor = graph.get_tensor_by_name(name)
            feeds[tensor] = rng.standard_normal(tensor.shape.as_list()).astype(np.float32)
        feeds[graph.get_tensor_by_name("attention_mask:0")] = np.ones((2, 8), np.float32)
        hooks: list[Any] = [v1.train.LoggingTensorHook({"loss": loss}, every_n_iter=5)]
        losses: list[float] = []
        with v1.train.MonitoredTrainingSession(
            checkpoint_dir=str(checkpoints),
            save_summaries_steps=5,
            save_checkpoint_steps=7,
            log_step_count_steps=5,
            hooks=hooks + ([hook] if hook else []),
        ) as session:
            while not session.should_stop() and len(losses) < STEPS:
                losses.append(float(session.run([loss, advance], feeds)[0]))
    return losses


def test_a_monitored_training_session_with_its_default_hooks_stitches(tmp_path: Path) -> None:
    plain = _train(None, tmp_path / "plain")
    hook, _ = hooked(tmp_path, "monitored")
    stitched = _train(hook, tmp_path / "stitched")
    assert hook.controller is not None and hook.controller.job_reverted is None, hook.controller.job_reverted
    assert hook.installed and sum(hook.backend_calls.values()) > 0
    assert stitched == pytest.approx(plain, rel=1e-4)
    assert sorted(p.name for p in (tmp_path / "stitched").glob("*.index")) == sorted(
        p.name for p in (tmp_path / "plain").glob("*.index")
    )


def test_an_op_reading_an_unfetchable_output_stays_with_tf() -> None:
    graph = tf.Graph()
    with graph.as_default():
        v1.train.get_or_create_global_step()
        read = training_util._get_or_create_global_step_read()  # what MonitoredTrainingSession's hooks fetch
        (read * 2 + 1) * 3
        conversion = convert(StepOps(graph))
    (branch,) = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert not graph.is_fetchable(branch)
    readers = [op for out in branch.outputs for op in out.consumers()]
    assert readers
    for reader in readers:  # the Identity that the IR would alias to the If's output
        assert conversion.ops[reader.name].fate == "boundary"
        assert "does not let a run fetch" in conversion.ops[reader.name].reason
    assert conversion.ops[read.op.name].fate == "lowered"  # what reads the Identity stitches as before
