from __future__ import annotations

from collections.abc import Mapping

from .units import format_size


def usage_table(sizes: Mapping[str, int]) -> str:
    """One `name  size` line per entry, largest first, then the total."""
    rows = sorted(sizes.items(), key=lambda item: item[1], reverse=True)
    width = max([len("total"), *(len(name) for name in sizes)])
    lines = [f"{name:<{width}}  {format_size(size)}" for name, size in rows]
    lines.append(f"{'total':<{width}}  {format_size(sum(sizes.values()))}")
    return "\n".join(lines)
