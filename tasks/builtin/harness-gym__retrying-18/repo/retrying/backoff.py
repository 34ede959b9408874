from collections.abc import Iterator


def delays(first: float, factor: float) -> Iterator[float]:
    """first, first * factor, first * factor ** 2, ..."""
    current = first
    while True:
        yield current
        current *= factor
