import pytest

from whenish import phrase_for


@pytest.mark.parametrize(
    "days,words",
    [(0, "today"), (1, "tomorrow"), (-1, "yesterday"), (3, "in 3 days"), (-13, "13 days ago"),
     (14, "in 2 weeks"), (-22, "3 weeks ago")],
)
def test_phrase_for(days, words):
    assert phrase_for(days) == words
