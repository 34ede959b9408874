from __future__ import annotations

from .rows import split_row
from .table import Table


def read_table(text: str, *, delimiter: str = ",", header: bool = True) -> Table:
    """Read delimited text into a Table. Blank lines are skipped.

    With `header=False` the columns are named "1", "2", ...
    """
    if len(delimiter) != 1 or delimiter in ('"', "\n", "\r"):
        raise ValueError(f"delimiter must be one character other than a quote or newline, got {delimiter!r}")
    rows = [split_row(line) for line in text.splitlines() if line.strip()]
    if not rows:
        return Table(columns=[], rows=[])
    if header:
        columns, rows = rows[0], rows[1:]
    else:
        columns = [str(number) for number in range(1, len(rows[0]) + 1)]
    for number, row in enumerate(rows, start=2 if header else 1):
        if len(row) != len(columns):
            raise ValueError(f"row {number} has {len(row)} cells, expected {len(columns)}")
    return Table(columns=columns, rows=rows)
