"""Errors a call can end in, independent of dialect; each dialect renders them its own way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ErrorKind = Literal[
    "invalid_request",  # 400: malformed JSON, wrong field types, missing fields
    "context_length",  # 400: prompt does not fit the model's context
    "authentication",  # 401: unknown, closed or expired session key; missing admin key
    "forbidden",  # 403: a session key on an admin route
    "not_found",  # 404
    "too_large",  # 413: the request body is over the proxy's limit
    "rate_limited",  # 429: the session has too many calls in flight
    "overloaded",  # engine unavailable: retriable
    "internal",  # 500
]

STATUS: dict[str, int] = {
    "invalid_request": 400,
    "context_length": 400,
    "authentication": 401,
    "forbidden": 403,
    "not_found": 404,
    "too_large": 413,
    "rate_limited": 429,
    "overloaded": 503,
    "internal": 500,
}


@dataclass
class ProxyError(Exception):
    kind: ErrorKind
    message: str
    param: str | None = None
    prompt_tokens: int | None = None  # for context_length
    max_context: int | None = None

    def __str__(self) -> str:
        return self.message

    @property
    def status(self) -> int:
        return STATUS[self.kind]


def invalid(message: str, param: str | None = None) -> ProxyError:
    return ProxyError("invalid_request", message, param)
