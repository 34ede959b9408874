import pytest

from spans import Interval


def test_length_is_end_minus_start():
    assert len(Interval(3, 10)) == 7


def test_reversed_interval_is_rejected():
    with pytest.raises(ValueError, match="before its start"):
        Interval(5, 2)


def test_overlap_is_half_open():
    assert Interval(1, 3).overlaps(Interval(2, 4))
    assert not Interval(1, 3).overlaps(Interval(3, 4))


def test_adjacent_intervals_touch():
    assert Interval(1, 3).touches(Interval(3, 4))
    assert not Interval(1, 3).touches(Interval(4, 5))
