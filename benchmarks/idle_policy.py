"""The machine's idle policy, as every timing figure must say: how a core that ran out of work waits for the next.

Input: Linux's sysfs (the cpuidle driver and governor, the guest halt-polling module's limit). Output: `IdlePolicy`,
its one-line description for a benchmark's header and its fields for a JSON record. Why it matters: on a KVM guest
with halt polling off, every wake-up of a TF worker thread is a VM exit: plain TF's MLP ran 1.18-1.30 ms a step that
way, 0.93-1.00 ms with the kernel's default polling, and its stitched steps saved 2.55 s against 1.24 s (session 52).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
HALTPOLL = Path("/sys/module/haltpoll/parameters")


@dataclass(frozen=True)
class IdlePolicy:
    """The cpuidle driver and governor ("" where sysfs does not say), and the guest's halt-polling limit in ns (None
    where the haltpoll driver is not loaded: a host, or a guest that halts at once)."""

    driver: str
    governor: str
    guest_halt_poll_ns: int | None

    def describe(self) -> str:
        """One line: "idle: cpuidle haltpoll (governor haltpoll); guest halt polling off (guest_halt_poll_ns 0)"."""
        driver = self.driver or "unknown"
        line = f"idle: cpuidle {driver}" + (f" (governor {self.governor})" if self.governor else "")
        if self.guest_halt_poll_ns is None:
            return line
        if self.guest_halt_poll_ns == 0:
            # Every idle vCPU halts at once: waking a TF worker costs a VM exit and the host's wake-up.
            return f"{line}; guest halt polling off (guest_halt_poll_ns 0)"
        return f"{line}; guest halt polling up to {self.guest_halt_poll_ns / 1000:.0f} us"


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def read(cpuidle: Path = CPUIDLE, haltpoll: Path = HALTPOLL) -> IdlePolicy:
    """The policy this machine runs under now (`cpuidle`, `haltpoll`: the sysfs folders, for tests)."""
    governor = _text(cpuidle / "current_governor_ro") or _text(cpuidle / "current_governor")
    limit = _text(haltpoll / "guest_halt_poll_ns")
    return IdlePolicy(_text(cpuidle / "current_driver"), governor, int(limit) if limit.isdigit() else None)
