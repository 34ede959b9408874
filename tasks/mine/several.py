"""Several repositories mined into one task directory (`--git A --git B ...`).

`Sources` takes one `HistorySource` per repository and offers their candidates in turn, one from
each (oldest first within each), so `--n N` spreads the kept tasks over the repositories instead
of filling the suite from the first one. Every repository keeps its own test environment and its
own label: instance ids (`<label>__<sha>`) and split units (`<label>/<file>`) cannot collide
across repositories, and two repositories with the same label are refused up front.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest
from typing import Any

from .candidate import Candidate
from .history import HistorySource

__all__ = ["Sources"]

Item = tuple[int, Any]  # (which source, that source's item)


class Sources:
    def __init__(self, sources: Sequence[HistorySource]) -> None:
        labels = [s.label for s in sources]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            paths = [str(s.path) for s in sources if s.label in twice]
            raise ValueError(f"two --git repositories share the name {twice[0]!r} "
                             f"({', '.join(paths)}): their task ids would collide; rename one "
                             "folder or mine it into another directory")  # fmt: skip
        units = {s.unit for s in sources}
        if len(units) != 1:
            raise ValueError(f"sources split by different units: {sorted(units)}")
        self.sources = list(sources)
        self.unit = units.pop()
        self.rejected_upfront = [r for s in sources for r in s.rejected_upfront]
        per_source = [[(i, item) for item in s.items()] for i, s in enumerate(sources)]
        self._items: list[Item] = [x for turn in zip_longest(*per_source) for x in turn
                                   if x is not None]  # fmt: skip

    def items(self) -> list[Item]:
        return self._items

    def units(self, item: Item) -> list[str]:
        source = self.sources[item[0]]
        return [f"{source.label}/{unit}" for unit in source.units(item[1])]

    def instance_id(self, item: Item) -> str:
        return self.sources[item[0]].instance_id(item[1])

    def evaluate(self, item: Item) -> Candidate | str:
        return self.sources[item[0]].evaluate(item[1])
