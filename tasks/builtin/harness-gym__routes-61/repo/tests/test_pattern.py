import pytest

from routes import compile_pattern


def test_int_converter():
    pattern = compile_pattern("/items/<int:item_id>")
    found = pattern.regex.match("/items/42")
    assert pattern.convert(found.groupdict()) == {"item_id": 42}


def test_unknown_converter_is_rejected():
    with pytest.raises(ValueError, match="unknown converter"):
        compile_pattern("/x/<uuid:key>")


def test_literal_dots_are_escaped():
    assert compile_pattern("/feed.xml").regex.match("/feedxxml") is None
