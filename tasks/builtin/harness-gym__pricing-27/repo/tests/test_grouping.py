import pytest

from pricing import group_thousands


@pytest.mark.parametrize("digits,grouped", [("1", "1"), ("1234", "1,234"), ("1234567", "1,234,567")])
def test_group_thousands(digits, grouped):
    assert group_thousands(digits) == grouped


def test_rejects_non_digits():
    with pytest.raises(ValueError):
        group_thousands("12a")
