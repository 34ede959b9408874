from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .backoff import delays
from .errors import RetryError

F = TypeVar("F", bound=Callable[..., Any])


def retry(
    *,
    attempts: int = 3,
    on: tuple[type[BaseException], ...] = (Exception,),
    delay: float = 0.1,
    factor: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Callable[[F], F]:
    """Call the function up to `attempts` times while it raises one of the exceptions in `on`.

    Between attempts, sleep `delay`, then `delay * factor`, ... After the last failed attempt,
    raise RetryError from the last exception. Exceptions not listed in `on` propagate at once.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            waits = delays(delay, factor)
            for attempt in range(1, attempts + 1):
                try:
                    return function(*args, **kwargs)
                except Exception as error:
                    if attempt == attempts:
                        raise RetryError(attempts, error) from error
                    sleep(next(waits))
            raise AssertionError("unreachable")

        return wrapper  # type: ignore[return-value]

    return decorate
