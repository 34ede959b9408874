from __future__ import annotations


def split_row(line: str) -> list[str]:
    """Split one line into cells.

    Double quotes protect delimiters inside a cell, and "" inside quotes is a literal quote.
    """
    cells: list[str] = []
    current: list[str] = []
    quoted = False
    index = 0
    while index < len(line):
        char = line[index]
        if quoted:
            if char == '"' and line[index + 1 : index + 2] == '"':
                current.append('"')
                index += 1
            elif char == '"':
                quoted = False
            else:
                current.append(char)
        elif char == '"':
            quoted = True
        elif char == ",":
            cells.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    cells.append("".join(current))
    return cells
