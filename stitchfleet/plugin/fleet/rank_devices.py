"""The devices one rank computes on, measured, so its saved seconds become the right device-hours.

Input: the TensorFlow session a rank runs (after it is created) and the process's CPU limits. Output: The
rules in full: docs/plugin/fleet.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


@dataclass(frozen=True)
class RankDevices:
    """What one rank computes on: kind ("gpu" or "cpu") and how many of them."""

    kind: str
    count: int


def measure(session: tf.compat.v1.Session, local_ranks: int = 1) -> RankDevices:
    """The GPUs `session` can place ops on, else this rank's share of the usable CPU cores (`local_ranks`:
    the job's ranks on this host, Horovod's local size)."""
    gpus = sum(1 for device in session.list_devices() if device.device_type == "GPU")
    if gpus:
        return RankDevices("gpu", gpus)
    return RankDevices("cpu", core_share(usable_cores(), local_ranks, pinned=pinned()))


def pinned() -> bool:
    """Whether this process runs on a subset of the host's CPUs (a launcher's binding: its own cores)."""
    return len(os.sched_getaffinity(0)) < (os.cpu_count() or 1)


def core_share(cores: int, local_ranks: int, *, pinned: bool) -> int:
    """A rank's cores: all it may use when pinned to its own, else its share of what the host's ranks share."""
    if pinned or local_ranks <= 1:
        return max(1, cores)
    return max(1, cores // local_ranks)


def usable_cores(v2: Path = CGROUP_V2_MAX, v1: tuple[Path, Path] = (CGROUP_V1_QUOTA, CGROUP_V1_PERIOD)) -> int:
    """Cores this process may run on: its affinity mask, capped by a cgroup quota when one is set."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_quota(v2, v1)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def cgroup_quota(v2: Path, v1: tuple[Path, Path]) -> float | None:
    """CPUs of the cgroup quota (quota / period), or None when unlimited or unreadable."""
    try:
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if v1[0].exists():
            quota_us, period_us = int(v1[0].read_text()), int(v1[1].read_text())
            return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None
    return None
