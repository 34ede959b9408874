from dedupe import unique_everseen, unique_justseen


def test_everseen_keeps_first_occurrences_in_order():
    assert list(unique_everseen("AAAABBBCCDAABBB")) == ["A", "B", "C", "D"]


def test_everseen_with_key():
    assert list(unique_everseen("ABBcCAD", key=str.lower)) == ["A", "B", "c", "D"]


def test_everseen_accepts_unhashable_items():
    assert list(unique_everseen([[1], [2], [1], [3]])) == [[1], [2], [3]]


def test_justseen_drops_consecutive_repeats_only():
    assert list(unique_justseen("AAABBA")) == ["A", "B", "A"]


def test_everseen_is_lazy():
    stream = unique_everseen(iter([1, 1, 2]))
    assert next(stream) == 1
