import pytest

from kvconf import ParseError, parse

SAMPLE = """
# service settings
[server]
host = 0.0.0.0
port = 8080
debug = yes

; storage
[paths]
data = /var/lib/app
"""


def test_sections_and_values():
    config = parse(SAMPLE)
    assert config.get("server", "host") == "0.0.0.0"
    assert config.getint("server", "port") == 8080
    assert config.getbool("server", "debug") is True
    assert config.get("paths", "data") == "/var/lib/app"


def test_missing_key_gives_default():
    assert parse(SAMPLE).get("server", "timeout", "30") == "30"


def test_key_outside_section_is_an_error():
    with pytest.raises(ParseError, match="line 1"):
        parse("name = x")


def test_line_without_equals_is_an_error():
    with pytest.raises(ParseError, match="line 2"):
        parse("[a]\njust words")


def test_empty_value():
    assert parse("[a]\nkey =").get("a", "key") == ""
