"""The GPUs TensorFlow sees in this process, as the native bridge needs to know them.

Input: the installed TensorFlow (imported lazily) and a TF device string (`/device:GPU:1`). Output:
whether a physical GPU is visible (TF then places device-less ops there) and the arch, as NVRTC names it
(`sm_90`), of the GPU an op placed there runs on; nothing here opens a CUDA context.
"""

from __future__ import annotations

import re


def gpu_visible() -> bool:
    """Whether TF in this process sees a physical GPU (it then places device-less ops there)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def gpu_index(device: str) -> int:
    """The GPU number of a TF device string (`/job:w/device:GPU:1` -> 1; unset or CPU: 0, where TF places a
    device-less op that has a GPU kernel)."""
    found = re.search(r"(?:^|/)(?:device:)?gpu:(\d+)$", device.strip().lower())
    return int(found.group(1)) if found else 0


def gpu_arch(device: str = "") -> str:
    """The arch of the GPU TF places an op with this device string on (its details from TF's device list,
    read without a context). A session's visible_device_list renumbers its GPUs, so the number may name
    another physical GPU of the job (the first, past those listed): one job's GPUs share an arch."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise RuntimeError("no GPU visible to TensorFlow")
    index = gpu_index(device)
    chosen = gpus[index] if index < len(gpus) else gpus[0]
    major, minor = tf.config.experimental.get_device_details(chosen)["compute_capability"]
    return f"sm_{major}{minor}"
