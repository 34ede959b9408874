"""A session's parsed messages, by the JSON they arrived as.

Every CLI resends its whole history on every call, so parsing it into canonical `Message`s (and
hashing each for the bridge) is the one part of a call's work that grows with the conversation:
at turn 30 of the shared benchmark (60 messages, 114 KB) it took 2.0 ms of a call's 4.5 ms of
request work, against 0.6 ms at turn 2. A message sent again byte for byte parses to the same
`Message`, so the dialects look each raw message up here by its JSON (`orjson.dumps` of the
decoded object: one C pass) and parse only what is new. A message that fails to parse is never
stored: its error is raised again, with the index of where it now sits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from .lru import BoundedLRU

T = TypeVar("T")

DEFAULT_MAX_ENTRIES = 2048


class MessageParseCache:
    """Bounded (least recently used out) and thread-safe: requests are parsed in worker threads."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        # Keyed by the parser too: a session's clients may speak several dialects.
        self._parsed: BoundedLRU[Any] = BoundedLRU(max_entries)

    @property
    def hits(self) -> int:
        return self._parsed.hits

    @property
    def misses(self) -> int:
        return self._parsed.misses

    def parse(self, raw: Any, param: str, parse: Callable[[Any, str], T]) -> T:
        """`parse(raw, param)`, or what it gave for the same JSON before."""
        if not isinstance(raw, dict):
            return parse(raw, param)  # the dialect's own error for a non-object
        key = (parse, orjson.dumps(raw))
        found = self._parsed.get(key)
        if found is not None:
            return found
        parsed = parse(raw, param)
        self._parsed.put(key, parsed)
        return parsed

    def __len__(self) -> int:
        return len(self._parsed)


class NoCache:
    """Parses every message (a request outside any session)."""

    @staticmethod
    def parse(raw: Any, param: str, parse: Callable[[Any, str], T]) -> T:
        return parse(raw, param)


NO_CACHE = NoCache()
