import pytest

from bytesize.units import format_size


@pytest.mark.parametrize(
    "n,text", [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_500_000, "1.5 MB")]
)
def test_decimal_units(n, text):
    assert format_size(n) == text


def test_precision():
    assert format_size(1_234_567, precision=3) == "1.235 MB"


def test_negative_sizes_are_refused():
    with pytest.raises(ValueError):
        format_size(-1)
