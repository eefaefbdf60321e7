"""The GPU an op runs on, as the native bridge reads it from TF: the device string's GPU number picks the
physical GPU whose arch the cluster is compiled for (each Horovod rank its own, never GPU 0 by default)."""

from __future__ import annotations

from typing import Any

import pytest

from stitchfleet.plugin.native.gpu_device import gpu_arch, gpu_index

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.tf


@pytest.mark.parametrize(
    ("device", "index"),
    [("", 0), ("/device:GPU:1", 1), ("/job:worker/replica:0/task:1/device:GPU:3", 3), ("/gpu:2", 2), ("/cpu:0", 0)],
)
def test_the_gpu_number_comes_from_the_device_string(device: str, index: int) -> None:
    assert gpu_index(device) == index


def test_the_arch_is_the_placed_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = ["gpu0", "gpu1"]
    capability = {"gpu0": (8, 0), "gpu1": (9, 0)}

    def details(device: Any) -> dict[str, Any]:
        return {"compute_capability": capability[device]}

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: gpus)
    monkeypatch.setattr(tf.config.experimental, "get_device_details", details)
    assert gpu_arch("/device:GPU:1") == "sm_90"
    assert gpu_arch("/device:GPU:0") == gpu_arch("") == "sm_80"
    assert gpu_arch("/device:GPU:7") == "sm_80"  # renumbered by a session's visible_device_list: the first
