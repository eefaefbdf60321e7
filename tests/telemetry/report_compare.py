"""Comparing two weekly reports: every figure equal, floats up to summation order.

Sums of floats depend on the order they are added in: PostgreSQL adds rows in whatever order it
scans, and the incremental rollups add a task's change (new minus old) where a recomputation adds
its figures once. Everything else (counts, names, order of the tasks) must be equal exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from stitchfleet.telemetry import savings

RELATIVE = 1e-9
ABSOLUTE = 1e-9


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


def assert_same_figures(got: Any, expected: Any) -> None:
    """Equal dataclasses (nested too), floats within RELATIVE (or ABSOLUTE near zero)."""
    exact, floats = [], []  # type: ignore[var-annotated]
    exact_expected, floats_expected = [], []  # type: ignore[var-annotated]
    _split(got, exact, floats)
    _split(expected, exact_expected, floats_expected)
    assert exact == exact_expected
    assert floats == pytest.approx(floats_expected, rel=RELATIVE, abs=ABSOLUTE)


def assert_same_report(got: savings.WeeklyReport, expected: savings.WeeklyReport) -> None:
    """Same tasks listed, rollups, totals and days (the attribution text aside)."""
    for name in ("jobs", "bottom", "rollups", "totals", "daily"):
        assert_same_figures(getattr(got, name), getattr(expected, name))
