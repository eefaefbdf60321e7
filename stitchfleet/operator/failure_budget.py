"""How many refused authentications a client address may still cost the API server.

Input: the client's address at each refused token and the time. Output: `allows(address)`: whether
a token this server has not seen yet from that address may go to a TokenReview. Each address has a
bucket of `burst` refusals that refills at `per_second`; an empty bucket answers 429 without a
review, so a client cycling invalid tokens costs a few reviews, not one each. Bounded: the least
recently refused addresses are forgotten first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class FailureBudget:
    """Token buckets of refusals per client address (see the module docstring)."""

    def __init__(
        self,
        *,
        burst: float = 20.0,
        per_second: float = 1.0,
        max_addresses: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst, self._rate, self._max = burst, per_second, max_addresses
        self._clock = clock  # seconds; a test steps its own clock instead of sleeping
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (level, at)
        self._lock = threading.Lock()

    def _level(self, address: str, now: float) -> float:
        level, at = self._buckets.get(address, (self._burst, now))
        return min(self._burst, level + (now - at) * self._rate)

    def allows(self, address: str) -> bool:
        """Whether `address` may still cost a TokenReview (at least one refusal left in its bucket)."""
        with self._lock:
            return self._level(address, self._clock()) >= 1.0

    def refused(self, address: str) -> None:
        """Spends one refusal of `address`'s bucket."""
        with self._lock:
            now = self._clock()
            self._buckets[address] = (max(0.0, self._level(address, now) - 1.0), now)
            self._buckets.move_to_end(address)
            while len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
