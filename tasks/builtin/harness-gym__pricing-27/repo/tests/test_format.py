from decimal import Decimal

import pytest

from pricing import Line, format_price, invoice_total


def test_two_decimals_and_grouping():
    assert format_price(1234.5) == "$1,234.50"


def test_negative_amount():
    assert format_price(-12.3) == "-$12.30"


def test_other_currency():
    assert format_price("99.99", currency="EUR") == "€99.99"


def test_unknown_currency():
    with pytest.raises(ValueError, match="unsupported currency"):
        format_price(1, currency="XYZ")


def test_invoice_total_is_exact():
    lines = [Line("pen", Decimal("0.10"), 3), Line("pad", Decimal("2.20"))]
    assert invoice_total(lines) == Decimal("2.50")
    assert format_price(invoice_total(lines)) == "$2.50"
