from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class Line:
    description: str
    unit_price: Decimal
    quantity: int = 1

    @property
    def total(self) -> Decimal:
        return self.unit_price * self.quantity


def invoice_total(lines: Iterable[Line]) -> Decimal:
    return sum((line.total for line in lines), Decimal("0"))
