"""What a probe finding is about, besides the cluster's fingerprint: the device profile and the shapes.

Input: the backend a cluster runs on (cpu, cuda, ...), the declared GPU type (STITCHFLEET_GPU_TYPE), and a
cluster's IR graph. Output: The rules in full: docs/plugin/fleet.md.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from stitchfleet.compiler import targets
from stitchfleet.plugin.fleet.rank_devices import usable_cores

if TYPE_CHECKING:
    from stitchfleet.compiler.ir import Graph

log = logging.getLogger("stitchfleet.plugin")
CPUINFO = Path("/proc/cpuinfo")
MAX_PROFILE = 128
MAX_SHAPES = 120  # well within the row's 256: a report and a reason still read it


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform says, else the machine."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def gpu_name(declared: str = "") -> str:
    """The first visible GPU's name as TF reports it, else the declared GPU type."""
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            found = str(tf.config.experimental.get_device_details(gpus[0]).get("device_name", ""))
            if found:
                return found
    except Exception as err:  # a name is telemetry: never fail the job over it
        log.info("stitchfleet: GPU name unknown (%s)", type(err).__name__)
    return declared or "unknown gpu"


@functools.cache
def profile(backend: str, declared_gpu: str = "") -> str:
    """The device profile a cluster's probe ran on (see the module docstring); the same for a process."""
    found = gpu_name(declared_gpu) if targets.profile(backend).runs_on == "gpu" else f"{cpu_model()} x{usable_cores()}"
    return f"{backend}:{found}"[:MAX_PROFILE]


def input_shapes(graph: Graph) -> str:
    """The IR graph's parameters in order, dtype and dims ('?' for an unknown dim)."""
    parts = []
    for node in graph.parameters:
        dims = ",".join(str(d) if d >= 0 else "?" for d in node.shape)
        parts.append(f"{node.dtype.value}[{dims}]")
    text = ",".join(parts)
    if len(text) <= MAX_SHAPES:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{text[: MAX_SHAPES - 16]}..#{digest}"


def group_key(members: list[tuple[str, str, str]]) -> tuple[str, str, str]:
    """The key of a group probe's finding (every cluster of `members` on together): (fingerprint, profile,
    shapes) of its own, from the members' keys (fingerprint, profile, shapes) in fingerprint order, so the
    same clusters on the same device at the same shapes meet the same finding in the fleet's memory."""
    ordered = sorted(members)
    fingerprints = hashlib.sha256(",".join(f for f, _, _ in ordered).encode()).hexdigest()[:24]
    shapes = hashlib.sha256("|".join(s for _, _, s in ordered).encode()).hexdigest()[:24]
    profile = ordered[0][1] if ordered else ""
    return f"group:{fingerprints}", profile, f"group of {len(ordered)}: {shapes}"
