import pytest

from retrying import RetryError, retry


class Flaky:
    def __init__(self, failures, error=ConnectionError):
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error("try again")
        return "ok"


def test_succeeds_after_transient_failures():
    flaky = Flaky(2)
    assert retry(attempts=3, on=(ConnectionError,), delay=0)(flaky)() == "ok"
    assert flaky.calls == 3


def test_gives_up_with_retry_error():
    flaky = Flaky(5)
    with pytest.raises(RetryError) as raised:
        retry(attempts=3, on=(ConnectionError,), delay=0)(flaky)()
    assert flaky.calls == 3
    assert isinstance(raised.value.last_error, ConnectionError)


def test_backoff_grows_by_factor():
    slept = []
    retry(attempts=4, delay=1.0, factor=3.0, sleep=slept.append)(Flaky(3))()
    assert slept == [1.0, 3.0, 9.0]


def test_keeps_function_metadata():
    @retry()
    def documented():
        """Docs."""

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Docs."


def test_attempts_must_be_positive():
    with pytest.raises(ValueError):
        retry(attempts=0)
