from semverlite import satisfies


def test_satisfies_range():
    assert satisfies("1.4.0", ">=1.2.0,<2.0.0")
    assert not satisfies("2.0.0", ">=1.2.0,<2.0.0")


def test_prerelease_is_below_release_bound():
    assert satisfies("2.0.0-rc.1", "<2.0.0")
