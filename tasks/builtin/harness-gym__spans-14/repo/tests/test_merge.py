from spans import Interval, merge, total_length


def test_merge_of_nothing_is_empty():
    assert merge([]) == []


def test_overlapping_sorted_intervals_merge():
    assert merge([Interval(1, 4), Interval(2, 6), Interval(8, 9)]) == [
        Interval(1, 6),
        Interval(8, 9),
    ]


def test_touching_intervals_merge():
    assert merge([Interval(1, 3), Interval(3, 5)]) == [Interval(1, 5)]


def test_contained_interval_is_absorbed():
    assert merge([Interval(1, 10), Interval(2, 3)]) == [Interval(1, 10)]


def test_total_length_of_sorted_intervals():
    assert total_length([Interval(0, 2), Interval(1, 4), Interval(10, 11)]) == 5
