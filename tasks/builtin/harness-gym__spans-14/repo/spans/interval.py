from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The half-open range [start, end)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} is before its start {self.start}")

    def __len__(self) -> int:
        return self.end - self.start

    def overlaps(self, other: Interval) -> bool:
        return self.start < other.end and other.start < self.end

    def touches(self, other: Interval) -> bool:
        """Overlapping or adjacent: [1, 3) and [3, 5) touch."""
        return self.start <= other.end and other.start <= self.end
