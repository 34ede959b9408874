from __future__ import annotations

from decimal import Decimal

from .grouping import group_thousands

SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£"}


def format_price(amount: float | Decimal | str, currency: str = "USD") -> str:
    """'$1,234.50': the currency symbol, thousands separators, exactly two decimals.

    Amounts are rounded half up to the cent, as on a printed invoice.
    """
    try:
        symbol = SYMBOLS[currency]
    except KeyError:
        raise ValueError(f"unsupported currency {currency!r}") from None
    negative = float(amount) < 0
    rounded = round(abs(float(amount)), 2)
    whole, cents = f"{rounded:.2f}".split(".")
    sign = "-" if negative else ""
    return f"{sign}{symbol}{group_thousands(whole)}.{cents}"
