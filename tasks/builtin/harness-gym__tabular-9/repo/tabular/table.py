from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> list[str]:
        try:
            index = self.columns.index(name)
        except ValueError:
            raise KeyError(f"no column {name!r}; columns: {self.columns}") from None
        return [row[index] for row in self.rows]

    def as_dicts(self) -> list[dict[str, str]]:
        return [dict(zip(self.columns, row)) for row in self.rows]
