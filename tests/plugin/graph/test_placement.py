"""placement: clusters on a GPU stay with TF until the GPU bridge exists (a CPU op never enters a GPU path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stitchfleet.plugin.graph.placement import device_kind, gpu_reason


class _Op:
    def __init__(self, name: str, device: str) -> None:
        self.name, self.device = name, device


@pytest.mark.parametrize(
    ("device", "kind"),
    [
        ("/device:GPU:0", "gpu"),
        ("/job:worker/replica:0/task:1/device:GPU:3", "gpu"),
        ("/gpu:1", "gpu"),
        ("/device:CPU:0", "cpu"),
        ("/cpu:0", "cpu"),
        ("", ""),
        ("/job:worker/task:0", ""),
    ],
)
def test_device_kind(device: str, kind: str) -> None:
    assert device_kind(device) == kind


def test_gpu_reason_names_the_op() -> None:
    assert gpu_reason([_Op("a", "/device:CPU:0"), _Op("b", "/device:CPU:0")], gpu_visible=True) is None
    reason = gpu_reason([_Op("a", "/device:CPU:0"), _Op("mul", "/device:GPU:0")], gpu_visible=False)
    assert reason is not None and "placed on a GPU (mul on /device:GPU:0)" in reason
    soft = gpu_reason([_Op("add", "")], gpu_visible=True)
    assert soft is not None and "would be placed on a GPU (add has no device" in soft
    assert gpu_reason([_Op("add", "")], gpu_visible=False) is None


@pytest.mark.tf
def test_a_graph_placed_on_a_gpu_is_left_to_tf_and_runs(tmp_path: Path) -> None:
    """The demo encoder built under /device:GPU:0 (soft placement runs it on this CPU machine)."""
    import tensorflow as tf

    from stitchfleet.demo import models
    from tests.plugin.hook_harness import _feeds, hooked

    hook, _ = hooked(tmp_path, "gpu-placed")
    model = models.MODELS["bert_encoder"]
    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:GPU:0"):
        tf.compat.v1.set_random_seed(1)
        model.build(model.small)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        creator = tf.compat.v1.train.ChiefSessionCreator(config=config)
        with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as session:
            values: list[Any] = [session.run([loss, train_op], _feeds(graph))[0] for _ in range(3)]
    assert len(values) == 3 and not hook.installed and not hook.active
    assert hook.off and all("GPU" in reason or "not on the training path" in reason for reason in hook.off.values())
    assert any("placed on a GPU" in reason for reason in hook.off.values())
