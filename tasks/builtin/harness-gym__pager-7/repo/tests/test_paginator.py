import pytest

from pager import PageOutOfRange, Paginator


def test_per_page_must_be_positive():
    with pytest.raises(ValueError):
        Paginator([1, 2], per_page=0)


def test_partial_last_page():
    paginator = Paginator(list(range(21)), per_page=10)
    assert paginator.page_count == 3
    assert paginator.page(3).items == [20]


def test_empty_sequence_has_one_empty_page():
    paginator = Paginator([], per_page=5)
    assert paginator.page_count == 1
    assert paginator.page(1).items == []


def test_page_zero_is_out_of_range():
    with pytest.raises(PageOutOfRange):
        Paginator([1, 2, 3], per_page=2).page(0)


def test_first_page_has_no_previous():
    page = Paginator(list(range(5)), per_page=2).page(1)
    assert not page.has_previous
    assert page.next_number == 2
