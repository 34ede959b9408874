from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_NOTHING = object()


def unique_everseen(
    items: Iterable[T], key: Callable[[T], Any] | None = None
) -> Iterator[T]:
    """Yield each element once, in first-seen order; `key` says what makes two equal.

    Works for unhashable elements too (lists, dicts).
    """
    seen: list[Any] = []
    for item in items:
        marker = item if key is None else key(item)
        if marker not in seen:
            seen.append(marker)
            yield item


def unique_justseen(
    items: Iterable[T], key: Callable[[T], Any] | None = None
) -> Iterator[T]:
    """Drop consecutive repeats only: `AAABBA` -> `ABA`."""
    previous: Any = _NOTHING
    for item in items:
        marker = item if key is None else key(item)
        if previous is _NOTHING or marker != previous:
            previous = marker
            yield item


def is_hashable(value: Any) -> bool:
    return isinstance(value, Hashable)
