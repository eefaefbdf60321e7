"""The machine's idle policy as benchmarks print it: read from sysfs folders laid out as Linux lays them out.

Input: temporary folders standing for /sys/devices/system/cpu/cpuidle and /sys/module/haltpoll/parameters.
Output: what `idle_policy.read` found and the line benchmarks print with their figures.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import idle_policy


def _sysfs(tmp_path: Path, driver: str | None, poll_ns: str | None) -> tuple[Path, Path]:
    cpuidle, haltpoll = tmp_path / "cpuidle", tmp_path / "haltpoll"
    cpuidle.mkdir()
    haltpoll.mkdir()
    if driver is not None:
        (cpuidle / "current_driver").write_text(f"{driver}\n")
        (cpuidle / "current_governor_ro").write_text(f"{driver}\n")
    if poll_ns is not None:
        (haltpoll / "guest_halt_poll_ns").write_text(f"{poll_ns}\n")
    return cpuidle, haltpoll


def test_a_guest_with_halt_polling_off_says_so(tmp_path: Path) -> None:
    found = idle_policy.read(*_sysfs(tmp_path, "haltpoll", "0"))
    assert found == idle_policy.IdlePolicy("haltpoll", "haltpoll", 0)
    line = found.describe()
    assert line == "idle: cpuidle haltpoll (governor haltpoll); guest halt polling off (guest_halt_poll_ns 0)"


def test_a_guest_polling_says_for_how_long(tmp_path: Path) -> None:
    found = idle_policy.read(*_sysfs(tmp_path, "haltpoll", "200000"))
    assert found.guest_halt_poll_ns == 200_000
    assert found.describe().endswith("; guest halt polling up to 200 us")


def test_a_host_without_the_haltpoll_module_names_its_driver_alone(tmp_path: Path) -> None:
    found = idle_policy.read(*_sysfs(tmp_path, "intel_idle", None))
    assert found.guest_halt_poll_ns is None
    assert found.describe() == "idle: cpuidle intel_idle (governor intel_idle)"


def test_a_machine_whose_sysfs_says_nothing_is_unknown_not_an_error(tmp_path: Path) -> None:
    found = idle_policy.read(tmp_path / "absent", tmp_path / "absent too")
    assert found == idle_policy.IdlePolicy("", "", None)
    assert found.describe() == "idle: cpuidle unknown"
