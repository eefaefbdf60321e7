"""Comparing two weekly reports: every figure equal, floats up to summation order.

Sums of floats depend on the order they are added in: PostgreSQL adds rows in whatever order it
scans, and the incremental rollups add a task's change (new minus old) where a recomputation adds
its figures once. Everything else (counts, names, order of the tasks, the held-out checks' verdicts) must be
equal exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from stitchfleet.telemetry import savings

RELATIVE = 1e-9
ABSOLUTE = 1e-9
# The held-out check's figures (a step's seconds, its sd: ~1e-4 s) are small: ABSOLUTE would pass them unchecked.
CHECK_ABSOLUTE = 1e-15


def _split(value: Any, exact: list[Any], floats: list[float]) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            _split(getattr(value, item.name), exact, floats)
    elif isinstance(value, tuple | list):
        exact.append(len(value))
        for item in value:
            _split(item, exact, floats)
    elif isinstance(value, float):
        floats.append(value)
    else:
        exact.append(value)


def assert_same_figures(got: Any, expected: Any, absolute: float = ABSOLUTE) -> None:
    """Equal dataclasses (nested too), floats within RELATIVE (or `absolute` near zero)."""
    exact, floats = [], []  # type: ignore[var-annotated]
    exact_expected, floats_expected = [], []  # type: ignore[var-annotated]
    _split(got, exact, floats)
    _split(expected, exact_expected, floats_expected)
    assert exact == exact_expected
    assert floats == pytest.approx(floats_expected, rel=RELATIVE, abs=absolute)


def assert_same_report(got: savings.WeeklyReport, expected: savings.WeeklyReport) -> None:
    """Same tasks listed, rollups, totals and days (the attribution text aside), the same held-out checks (every
    field, in the same order) and the same net after them per device kind."""
    for name in ("jobs", "bottom", "rollups", "totals", "daily", "after_check"):
        assert_same_figures(getattr(got, name), getattr(expected, name))
    assert_same_figures(got.held_out, expected.held_out, absolute=CHECK_ABSOLUTE)
