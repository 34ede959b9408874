from tabular import split_row


def test_plain_cells():
    assert split_row("a,b,c") == ["a", "b", "c"]


def test_quoted_comma_stays_in_cell():
    assert split_row('"Smith, J",42') == ["Smith, J", "42"]


def test_doubled_quote_is_literal():
    assert split_row('"say ""hi""",x') == ['say "hi"', "x"]


def test_empty_cells():
    assert split_row(",,") == ["", "", ""]
