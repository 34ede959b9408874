"""Request limits: a body read within a byte limit, and caps on messages and tools.

The body limit holds while the body is read, for a declared `Content-Length` (refused before a
byte is read) and for a chunked body (refused as soon as it passes the limit), so an oversized
request never sits in memory whole. The counts are checked on the parsed JSON before anything
is built from it. Each violation is a `ProxyError` the route answers in the caller's dialect.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import ClientDisconnect, Request

from .canonical import ChatRequest
from .errors import ProxyError, invalid
from .settings import ProxySettings


class ClientGone(Exception):
    """The client disconnected (or missed the body deadline) while sending its body."""


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, so_far=True)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def _too_large(size: int, limit: int, so_far: bool = False) -> ProxyError:
    read = "more than " if so_far else ""
    return ProxyError(
        "too_large",
        f"Request body of {read}{size} bytes exceeds the proxy's limit of {limit} bytes "
        "(max_body_bytes).",
    )


def check_counts(body: dict[str, Any], items_param: str, settings: ProxySettings) -> None:
    """Refuse too many messages (input items) or tools, before parsing any of them."""
    _check_length(body.get(items_param), items_param, settings.max_messages, "max_messages")
    _check_length(body.get("tools"), "tools", settings.max_tools, "max_tools")


def check_message_count(request: ChatRequest, settings: ProxySettings) -> None:
    """The canonical count can exceed the wire's (one Anthropic message holding many tool
    results becomes one message per result)."""
    _check_length(request.messages, "messages", settings.max_messages, "max_messages")


def _check_length(items: Any, param: str, limit: int, setting: str) -> None:
    if isinstance(items, (list, tuple)) and len(items) > limit:
        raise invalid(
            f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, "
            f"but got an array with length {len(items)} instead (the proxy's {setting}).",
            param,
        )
