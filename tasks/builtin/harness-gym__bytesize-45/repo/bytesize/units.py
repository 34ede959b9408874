"""Human-readable byte counts."""

from __future__ import annotations

_DECIMAL = ["B", "kB", "MB", "GB", "TB", "PB"]


def format_size(n_bytes: int, precision: int = 1) -> str:
    """`format_size(1_500_000) == "1.5 MB"` (powers of 1000)."""
    if n_bytes < 0:
        raise ValueError("a size cannot be negative")
    value = float(n_bytes)
    for unit in _DECIMAL:
        if value < 1000 or unit == _DECIMAL[-1]:
            break
        value /= 1000
    if unit == "B":
        return f"{n_bytes} B"
    return f"{value:.{precision}f} {unit}"
