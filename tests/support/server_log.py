"""What the proxy's HTTP server logs as errors: an exception that escaped the app."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def server_errors() -> Iterator[list[logging.LogRecord]]:
    """The records uvicorn logs at ERROR while the block runs (it logs "Exception in ASGI
    application" for anything the app let escape)."""
    handler = _Collect()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
