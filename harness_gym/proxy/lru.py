"""`BoundedLRU`: the one least-recently-used map the proxy's caches share (a session's parsed
messages, the renderer's ids of whole turns). Bounded by a weight per value, thread-safe:
requests are parsed and rendered in worker threads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class BoundedLRU(Generic[V]):
    """At most `max_weight` in all, `weight(value)` each (1 by default); the least recently
    used go first. A value heavier than the whole bound is never kept."""

    def __init__(self, max_weight: int, weight: Callable[[V], int] = lambda _: 1) -> None:
        self.max_weight = max_weight
        self.weight = 0
        self.hits = self.misses = 0
        self._weigh = weight
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
            else:
                self._items.move_to_end(key)
                self.hits += 1
            return value

    def put(self, key: Hashable, value: V) -> None:
        weight = self._weigh(value)
        if weight > self.max_weight:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = value
            self.weight += weight
            while self.weight > self.max_weight:
                _, dropped = self._items.popitem(last=False)
                self.weight -= self._weigh(dropped)

    def __len__(self) -> int:
        return len(self._items)
