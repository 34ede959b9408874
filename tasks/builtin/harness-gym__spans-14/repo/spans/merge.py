from __future__ import annotations

from collections.abc import Iterable

from .interval import Interval


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Join overlapping or touching intervals into a sorted list of disjoint intervals."""
    merged: list[Interval] = []
    for interval in intervals:
        if merged and merged[-1].touches(interval):
            last = merged.pop()
            merged.append(Interval(last.start, max(last.end, interval.end)))
        else:
            merged.append(interval)
    return merged


def total_length(intervals: Iterable[Interval]) -> int:
    """The length of the union of `intervals`."""
    return sum(len(interval) for interval in merge(intervals))
