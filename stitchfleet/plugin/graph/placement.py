"""Where TensorFlow runs a cluster's ops, and so which backend may stitch it: a CPU op never enters a GPU data
path, a GPU op never a CPU one, and a cluster never spans devices.

The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stitchfleet.compiler import targets

if TYPE_CHECKING:
    import tensorflow as tf

SETTINGS = ("auto", *targets.names(in_jobs=True))  # the job backends of the target registry


def _runs_on(setting: str) -> str | None:
    """The device kind the chosen backend stitches (None for `auto`: either)."""
    return None if setting == "auto" else targets.profile(setting).runs_on


@dataclass(frozen=True)
class Route:
    """The backend that stitches the cluster (None: it stays with TF, `reason` says why) and its device."""

    backend: str | None
    device: str  # canonical: [/job:x/replica:r/task:t]/device:GPU:n or .../device:CPU:0; '' when it spans
    reason: str | None = None


def device_kind(device: str) -> str:
    """'gpu', 'cpu' or '' (unset) from a TF device string like /job:w/replica:0/task:0/device:GPU:0."""
    last = device.rsplit("/", 1)[-1].lower()
    if last.startswith(("device:gpu", "gpu")):
        return "gpu"
    if last.startswith(("device:cpu", "cpu")):
        return "cpu"
    return ""


FIELDS = ("job", "replica", "task")


def device_fields(device: str, gpu_visible: bool) -> dict[str, str]:
    """The parts of a device string that are set (job, replica, task) plus the device itself
    (`GPU:n` or `CPU:0`; an op without one runs on GPU:0 when a GPU is visible, else on the CPU)."""
    fields: dict[str, str] = {}
    for part in (p for p in device.split("/") if p):
        name, _, value = part.partition(":")
        if name in FIELDS:
            fields[name] = value
    kind = device_kind(device) or ("gpu" if gpu_visible else "cpu")
    number = re.search(r":(\d+)$", device.rsplit("/", 1)[-1]) if device_kind(device) == "gpu" else None
    fields["device"] = f"GPU:{number.group(1) if number else 0}" if kind == "gpu" else "CPU:0"
    return fields


def _compose(fields: dict[str, str]) -> str:
    return "".join(f"/{name}:{fields[name]}" for name in FIELDS if name in fields) + f"/device:{fields['device']}"


def canonical_device(device: str, gpu_visible: bool) -> str:
    """Where an op with this device string runs: the task parts it names and /device:GPU:n or /device:CPU:0."""
    return _compose(device_fields(device, gpu_visible))


def _where(ops: list[Any], gpu_visible: bool) -> tuple[str, dict[str, str]]:
    """The cluster's single device, or '' and the device of each op when they differ. Partial device
    strings merge as TF's placer merges them: `/device:GPU:0` and `/job:w/task:0/device:GPU:0` are one
    device; two values of a part that both name it (GPU:0 and GPU:1, task 0 and task 1) are two."""
    devices = {op.name: canonical_device(op.device or "", gpu_visible) for op in ops}
    merged: dict[str, str] = {}
    for op in ops:
        for name, value in device_fields(op.device or "", gpu_visible).items():
            if merged.setdefault(name, value) != value:
                return "", devices
    return (_compose(merged) if merged else ""), devices


def _gpu_words(ops: list[Any]) -> str:
    """'placed on a GPU (mul on /device:GPU:0)' or, for an op without a device, 'would be placed ...'."""
    for op in ops:
        if device_kind(op.device or "") == "gpu":
            return f"placed on a GPU ({op.name} on {op.device})"
    name = next((op.name for op in ops if not device_kind(op.device or "")), "?")
    return f"would be placed on a GPU ({name} has no device and this process sees a GPU)"


def route(ops: Iterable[tf.Operation], setting: str, gpu_visible: bool, gpu_op: str | None) -> Route:
    """The backend for these ops (see the module docstring); `gpu_op` is why the GPU op cannot run, or None."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown backend {setting!r} (expected {', '.join(SETTINGS)})")
    listed = list(ops)
    device, devices = _where(listed, gpu_visible)
    if not device:
        first = {where: name for name, where in sorted(devices.items(), reverse=True)}  # one op per device
        shown = ", ".join(f"{name} on {where}" for where, name in sorted(first.items())[:4])
        gpu = any(device_kind(where) == "gpu" for where in devices.values())
        head = f"{_gpu_words(listed)} and spans devices" if gpu else "spans devices"
        return Route(None, "", f"{head} ({shown}): a cluster never spans devices, it stays with TF")
    if device_kind(device) == "cpu":
        if _runs_on(setting) == "gpu":
            return Route(None, device, f"placed on the CPU: STITCHFLEET_BACKEND={setting} stitches GPU clusters only")
        return Route(targets.automatic("cpu") if setting == "auto" else setting, device)
    words = _gpu_words(listed)
    if _runs_on(setting) == "cpu":
        return Route(None, device, f"{words}: the {setting} backend runs on the CPU only, the cluster stays with TF")
    if gpu_op is not None:
        return Route(None, device, f"{words}: the GPU op cannot run here ({gpu_op}), the cluster stays with TF")
    return Route(targets.automatic("gpu") if setting == "auto" else setting, device)


def gpu_reason(
    ops: Iterable[tf.Operation], gpu_visible: bool, gpu_op: str | None = "the GPU op is not loaded"
) -> str | None:
    """Why these ops stay with TF because of where they run (None: the cpu backend or the GPU op takes them)."""
    return route(ops, "auto", gpu_visible, gpu_op).reason
