"""Where TensorFlow runs a cluster's ops, so that a CPU op never enters a GPU data path.

Input: the TF ops of a mapped cluster and whether this process sees a GPU. Output: the reason a
cluster must stay with TF because of placement, or None. Until the GPU bridge exists, the
stitched op runs on the CPU only: an op with an explicit GPU device (`/device:GPU:0`, `/gpu:1`)
is on a GPU, and so is an op with no device when a GPU is visible, because TF's placer puts every
op that has a GPU kernel on GPU:0 (all the element-wise ops and reductions clusters hold have one).
An op pinned to a CPU device stays eligible.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def device_kind(device: str) -> str:
    """'gpu', 'cpu' or '' (unset) from a TF device string like /job:w/replica:0/task:0/device:GPU:0."""
    last = device.rsplit("/", 1)[-1].lower()
    if last.startswith(("device:gpu", "gpu")):
        return "gpu"
    if last.startswith(("device:cpu", "cpu")):
        return "cpu"
    return ""


def gpu_reason(ops: Iterable[Any], gpu_visible: bool) -> str | None:
    """Why these ops run on a GPU (the first such op), or None when they all run on a CPU."""
    for op in ops:
        kind = device_kind(op.device or "")
        if kind == "gpu":
            where = f"{op.name} on {op.device}"
            return f"placed on a GPU ({where}): the stitched op runs on CPU only, the cluster stays with TF"
        if kind == "" and gpu_visible:
            return (
                f"would be placed on a GPU ({op.name} has no device and this process sees a GPU): the stitched op"
                " runs on CPU only, the cluster stays with TF"
            )
    return None


def gpu_visible() -> bool:
    """Whether TF in this process sees a physical GPU (it then places device-less ops there)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))
