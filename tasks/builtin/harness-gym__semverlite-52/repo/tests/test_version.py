from semverlite import InvalidVersion, Version, parse


def test_parse_release():
    assert parse("1.4.2") == Version(1, 4, 2)


def test_parse_prerelease():
    assert parse("2.0.0-rc.1") == Version(2, 0, 0, ("rc", "1"))


def test_str_round_trips():
    assert str(parse("2.0.0-rc.1")) == "2.0.0-rc.1"


def test_prerelease_sorts_before_release():
    assert parse("1.0.0-alpha") < parse("1.0.0-alpha.1") < parse("1.0.0-beta") < parse("1.0.0")


def test_numeric_ordering():
    assert parse("1.10.0") > parse("1.9.9")


def test_invalid_version_is_a_value_error():
    assert issubclass(InvalidVersion, ValueError)
