"""The refusal budget per client address: burst, refill, cap and forgetting, on a clock the test steps.

Input: a FailureBudget driven by a fake monotonic clock. Output: which refusals it still allows, so the
refill rate is checked exactly rather than by sleeping (a sleeping test reads whatever the machine's load
makes of the interval).
"""

from __future__ import annotations

from stitchfleet.operator.failure_budget import FailureBudget


class SteppedClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spend(budget: FailureBudget, address: str) -> int:
    """Refuses `address` while the budget allows it; returns how many refusals that took."""
    spent = 0
    while budget.allows(address):
        budget.refused(address)
        spent += 1
        assert spent < 10_000, "the budget never ran out"
    return spent


def test_a_new_address_has_its_whole_burst_and_then_nothing() -> None:
    clock = SteppedClock()
    budget = FailureBudget(burst=5.0, per_second=1.0, clock=clock)
    assert spend(budget, "10.0.0.1") == 5
    assert not budget.allows("10.0.0.1")
    assert budget.allows("10.0.0.2")  # another address has its own bucket


def test_the_bucket_refills_at_its_rate_and_no_faster() -> None:
    clock = SteppedClock()
    budget = FailureBudget(burst=5.0, per_second=0.5, clock=clock)
    spend(budget, "a")
    clock.now += 1.9  # 0.95 of a refusal: not yet one
    assert not budget.allows("a")
    clock.now += 0.1  # 2 s at 0.5 a second: exactly one
    assert budget.allows("a")
    budget.refused("a")
    assert not budget.allows("a")
    clock.now += 6.0  # three more
    assert spend(budget, "a") == 3


def test_the_refill_stops_at_the_burst() -> None:
    clock = SteppedClock()
    budget = FailureBudget(burst=4.0, per_second=1.0, clock=clock)
    spend(budget, "a")
    clock.now += 3600.0  # an hour idle refills to the burst, not to 3600
    assert spend(budget, "a") == 4


def test_a_clock_that_does_not_move_never_refills() -> None:
    clock = SteppedClock()
    budget = FailureBudget(burst=2.0, per_second=1000.0, clock=clock)
    assert spend(budget, "a") == 2
    assert not budget.allows("a")  # the rate is high, but no time passed


def test_the_least_recently_refused_address_is_forgotten_first() -> None:
    clock = SteppedClock()
    budget = FailureBudget(burst=1.0, per_second=0.001, max_addresses=2, clock=clock)
    for address in ("a", "b"):
        budget.refused(address)
    budget.refused("a")  # "a" refused again: now "b" is the least recent
    budget.refused("c")  # a third address: "b" is forgotten, so it has a whole burst again
    assert budget.allows("b")
    assert not budget.allows("a") and not budget.allows("c")
