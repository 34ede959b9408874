from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Page:
    number: int
    items: list[Any]
    page_count: int

    @property
    def has_next(self) -> bool:
        return self.number < self.page_count

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def next_number(self) -> int | None:
        return self.number + 1 if self.has_next else None
