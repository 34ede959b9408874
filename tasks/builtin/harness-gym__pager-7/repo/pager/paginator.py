from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import PageOutOfRange
from .page import Page


class Paginator:
    """Splits a sequence into pages of `per_page` items, numbered from 1.

    An empty sequence still has one (empty) page, so page 1 is always valid.
    """

    def __init__(self, items: Sequence[Any], per_page: int) -> None:
        if per_page < 1:
            raise ValueError(f"per_page must be at least 1, got {per_page}")
        self.items = items
        self.per_page = per_page

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def page_count(self) -> int:
        return self.count // self.per_page + 1

    def page(self, number: int) -> Page:
        if not 1 <= number <= self.page_count:
            raise PageOutOfRange(number, self.page_count)
        start = (number - 1) * self.per_page
        return Page(number, list(self.items[start : start + self.per_page]), self.page_count)

    def __iter__(self):
        for number in range(1, self.page_count + 1):
            yield self.page(number)
