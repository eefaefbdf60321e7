"""ISO weeks as half-open UTC time ranges, the unit of the savings report.

Input: a week label such as `2026-W47` (or a date). Output: a `Week` with its label, its first
instant (Monday 00:00 UTC) and its end (the next Monday 00:00 UTC, excluded), and its days.
A malformed label raises `WeekError` naming the expected format.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_LABEL = re.compile(r"(\d{4})-W(\d{2})")
EXPECTED = "an ISO week YYYY-Www, e.g. 2026-W47 (week 01-52, or 53 in long years)"


class WeekError(ValueError):
    """A week label that is not an ISO week; the message names the expected format."""


@dataclass(frozen=True)
class Week:
    """One ISO week: `start` (Monday 00:00 UTC) included, `end` (next Monday) excluded."""

    year: int
    number: int

    def __post_init__(self) -> None:
        try:
            dt.date.fromisocalendar(self.year, self.number, 1)
        except ValueError:
            raise WeekError(f"week {self.year}-W{self.number:02d} does not exist: expected {EXPECTED}") from None

    @property
    def label(self) -> str:
        """The ISO label, e.g. 2026-W47."""
        return f"{self.year}-W{self.number:02d}"

    @property
    def start(self) -> dt.datetime:
        """Monday 00:00 UTC, the first instant of the week."""
        monday = dt.date.fromisocalendar(self.year, self.number, 1)
        return dt.datetime(monday.year, monday.month, monday.day, tzinfo=dt.UTC)

    @property
    def end(self) -> dt.datetime:
        """The next Monday 00:00 UTC, the first instant after the week."""
        return self.start + dt.timedelta(days=7)

    def days(self) -> tuple[dt.date, ...]:
        """The seven UTC dates of the week, Monday first."""
        first = self.start.date()
        return tuple(first + dt.timedelta(days=offset) for offset in range(7))

    def contains(self, instant: dt.datetime) -> bool:
        """Whether an aware `instant` falls in [start, end)."""
        return self.start <= instant < self.end


def parse_week(text: str) -> Week:
    """The Week of a label like 2026-W47; WeekError naming the expected format otherwise."""
    match = _LABEL.fullmatch(text.strip())
    if match is None:
        raise WeekError(f"bad week {text!r}: expected {EXPECTED}")
    return Week(int(match.group(1)), int(match.group(2)))


def week_of(instant: dt.datetime | dt.date) -> Week:
    """The ISO week containing a date, or an aware datetime taken in UTC."""
    day = instant.astimezone(dt.UTC).date() if isinstance(instant, dt.datetime) else instant
    year, number, _ = day.isocalendar()
    return Week(year, number)
