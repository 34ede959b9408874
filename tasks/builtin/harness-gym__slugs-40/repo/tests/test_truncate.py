import pytest

from slugs import truncate_at_separator


def test_short_slug_is_unchanged():
    assert truncate_at_separator("abc", 5) == "abc"


def test_single_long_word_is_cut_hard():
    assert truncate_at_separator("abcdefgh", 4) == "abcd"


def test_max_length_must_be_positive():
    with pytest.raises(ValueError):
        truncate_at_separator("abc", 0)
