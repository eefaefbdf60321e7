"""rank_devices: what one rank computes on, measured from its session and its CPU limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stitchfleet.plugin.fleet import rank_devices


def _files(tmp_path: Path, v2: str | None = None, v1: tuple[str, str] | None = None) -> tuple[Path, tuple[Path, Path]]:
    v2_path, quota, period = tmp_path / "cpu.max", tmp_path / "cfs_quota_us", tmp_path / "cfs_period_us"
    if v2 is not None:
        v2_path.write_text(v2)
    if v1 is not None:
        quota.write_text(v1[0])
        period.write_text(v1[1])
    return v2_path, (quota, period)


@pytest.mark.parametrize(
    ("v2", "v1", "quota"),
    [
        ("max 100000\n", None, None),
        ("150000 100000\n", None, 1.5),
        (None, ("-1", "100000"), None),
        (None, ("400000", "100000"), 4.0),
        (None, None, None),
        ("garbage\n", None, None),
    ],
)
def test_cgroup_quota(tmp_path: Path, v2: str | None, v1: tuple[str, str] | None, quota: float | None) -> None:
    v2_path, v1_paths = _files(tmp_path, v2, v1)
    assert rank_devices.cgroup_quota(v2_path, v1_paths) == quota


def test_usable_cores_are_capped_by_the_quota_and_never_zero(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    v2_path, v1_paths = _files(tmp_path, "50000 100000\n")  # half a core rounds up to one
    assert rank_devices.usable_cores(v2_path, v1_paths) == 1
    v2_path, v1_paths = _files(tmp_path, "max 100000\n")
    assert rank_devices.usable_cores(v2_path, v1_paths) == affinity


@pytest.mark.tf
def test_a_cpu_session_measures_cpu_cores() -> None:
    import tensorflow as tf

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        found = rank_devices.measure(session)
    assert found == rank_devices.RankDevices("cpu", rank_devices.usable_cores())


@pytest.mark.parametrize(
    ("cores", "local", "is_pinned", "share"),
    [(2, 2, False, 1), (2, 1, False, 2), (8, 3, False, 2), (1, 4, False, 1), (4, 2, True, 4)],
)
def test_ranks_sharing_a_hosts_cores_count_their_share(cores: int, local: int, is_pinned: bool, share: int) -> None:
    # two ranks on one 2-core host were booked as 4 cores (issue 30 item 5); a pinned rank has its own cores
    assert rank_devices.core_share(cores, local, pinned=is_pinned) == share


@pytest.mark.tf
def test_two_local_ranks_of_an_unpinned_host_split_its_cores() -> None:
    import tensorflow as tf

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        found = rank_devices.measure(session, local_ranks=2)
    expected = rank_devices.usable_cores() if rank_devices.pinned() else max(1, rank_devices.usable_cores() // 2)
    assert found == rank_devices.RankDevices("cpu", expected)
