import pytest

from tabular import read_table


def test_header_and_rows():
    table = read_table("name,qty\napple,3\npear,5\n")
    assert table.columns == ["name", "qty"]
    assert table.column("qty") == ["3", "5"]
    assert table.as_dicts()[0] == {"name": "apple", "qty": "3"}


def test_without_header_columns_are_numbered():
    assert read_table("a,b\nc,d", header=False).columns == ["1", "2"]


def test_ragged_row_is_an_error():
    with pytest.raises(ValueError, match="row 3 has 1 cells"):
        read_table("a,b\n1,2\n3")


def test_multi_character_delimiter_is_rejected():
    with pytest.raises(ValueError, match="one character"):
        read_table("a::b", delimiter="::")


def test_unknown_column():
    with pytest.raises(KeyError):
        read_table("a,b\n1,2").column("c")
