from __future__ import annotations

from datetime import date, datetime

from .wording import phrase_for


def _as_date(value: date | datetime) -> date:
    return value.date() if isinstance(value, datetime) else value


def days_between(earlier: date | datetime, later: date | datetime) -> int:
    """Whole calendar days from `earlier` to `later` (negative when `later` is before)."""
    return _as_date(later).day - _as_date(earlier).day


def describe(day: date | datetime, *, today: date | datetime) -> str:
    """'today', 'tomorrow', 'in 3 days', '2 weeks ago', ... relative to `today`."""
    return phrase_for(days_between(today, day))
