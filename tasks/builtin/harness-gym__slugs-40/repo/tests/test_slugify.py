from slugs import slugify


def test_punctuation_becomes_one_separator():
    assert slugify("Hello, World!") == "hello-world"


def test_custom_separator():
    assert slugify("Hello World", separator="_") == "hello_world"


def test_digits_are_kept():
    assert slugify("Top 10 tips") == "top-10-tips"


def test_max_length_cuts_at_a_word():
    assert slugify("the quick brown fox", max_length=12) == "the-quick"
