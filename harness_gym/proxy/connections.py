"""The HTTP connection guard: read deadlines and a cap on open connections.

uvicorn waits for a request's headers and body with no deadline: a client that sends half a
request line, or its headers and then nothing, holds a connection (and a file descriptor) for
ever, and 1,100 of them locked every client out at the open-file limit (measured). uvicorn's own
`limit_concurrency` does not help (it answers 503 only once headers are complete, and counts the
stuck connections against everyone). `GuardedHttpProtocol` adds, per connection:

- a header deadline: from the connection's first byte (or from the first byte of the next
  request on a kept-alive connection) to the end of the headers, `header_timeout_s`;
- a body deadline: from the end of the headers to the end of the body, `body_timeout_s`
  (also after the app answered early, e.g. a 413, while the client is still sending);
- a byte cap on a body the app already answered: it is discarded as it arrives (so a client
  refused with a 413 can finish sending and read its answer), and a client that goes on past
  `max_discard_bytes` is disconnected;
- a cap on open connections: when one more arrives, the oldest connection that is only waiting
  (for its headers, or sending a body nobody reads) is closed to make room, so a flood of
  half-open connections never locks out a client that sends whole requests. With none of those
  to spare, the newcomer gets a 503.

A deadline that passes before any answer was sent gets a 408; the app sees a disconnect.
Idle keep-alive connections between requests are closed by uvicorn's `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


@dataclass
class ConnectionGuard:
    """Limits shared by all connections of one server, and the connections one may close."""

    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_discard_bytes: int
    # Connections that only wait (headers not complete, or a discarded body still arriving),
    # oldest first: the ones closed to make room.
    idle: dict[GuardedHttpProtocol, None] = field(default_factory=dict)
    open: int = 0

    def protocol_factory(self) -> Callable[..., GuardedHttpProtocol]:
        """What `uvicorn.Config(http=...)` takes."""
        return functools.partial(GuardedHttpProtocol, guard=self)


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._deadline: asyncio.TimerHandle | None = None
        self._body_bytes = 0
        self._in_body = False  # between the end of a request's headers and the end of its body
        self._refused = False

    # --- connection lifetime ------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self._guard
        guard.open += 1
        if guard.open > guard.max_connections and not self._evict_oldest_idle():
            self._refused = True
            self._reject(503, "the proxy has too many open connections; retry shortly")
            return
        self._wait_for_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.open -= 1
        self._cancel_deadline()
        self._guard.idle.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        # Bytes between requests that begin none (stray CRLFs) still start the header clock.
        if self._deadline is None and self._between_requests() and not self.transport.is_closing():
            self._wait_for_headers()

    # --- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._wait_for_headers()

    def on_headers_complete(self) -> None:
        self._cancel_deadline()
        self._guard.idle.pop(self, None)
        self._body_bytes = 0
        self._in_body = True
        self._deadline = self.loop.call_later(self._guard.body_timeout_s, self._body_too_slow)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:
            # Answered already (413, 401...): the rest is discarded as it arrives, within limits.
            if self._body_bytes > self._guard.max_discard_bytes:
                self.transport.close()
                return
            self._guard.idle.setdefault(self, None)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._cancel_deadline()
        self._guard.idle.pop(self, None)
        super().on_message_complete()
        if self._between_requests() and not self.transport.is_closing():
            # Answered before the body ended: uvicorn's keep-alive timer was armed and then
            # cleared by the body's bytes, so this connection's next wait needs a clock.
            self._wait_for_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._between_requests() and not self.transport.is_closing():
            self._guard.idle[self] = None  # kept alive, idle: may make room for a newcomer

    # --- deadlines ---------------------------------------------------------------------

    def _between_requests(self) -> bool:
        return not self._in_body and (self.cycle is None or self.cycle.response_complete)

    def _wait_for_headers(self) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self._guard.header_timeout_s, self._headers_too_slow)
        self._guard.idle.pop(self, None)
        self._guard.idle[self] = None  # newest last

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if self.cycle is None or self.cycle.response_complete:
            self._reject(408, f"request headers not received within "
                              f"{self._guard.header_timeout_s:g} s")
        else:
            self.transport.close()

    def _body_too_slow(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # The app may be waiting on the body: it sees a disconnect and writes nothing more.
            cycle.disconnected = True
            cycle.message_event.set()
            self._reject(408, f"request body not received within {self._guard.body_timeout_s:g} s")
        else:
            self.transport.close()

    def _evict_oldest_idle(self) -> bool:
        for victim in self._guard.idle:
            if victim is not self:
                self._guard.idle.pop(victim)
                log.debug("connection cap reached: closing an idle connection")
                victim._cancel_deadline()
                victim.transport.close()
                return True
        return False

    def _reject(self, status: int, message: str) -> None:
        """Answer outside the app (no request reached it) and close the connection."""
        self._guard.idle.pop(self, None)
        if self.transport.is_closing():
            return
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error",
                                       "code": status}})
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason, len(body), body)
        )
        self.transport.close()


def raise_open_file_limit(wanted: int = 65536) -> int:
    """Raise this process's soft limit on open files towards `wanted` (never above the hard
    limit), so the connection cap, not the file limit, decides who gets in. Returns the soft
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            log.warning("could not raise the open-file limit from %d to %d", soft, target)
    return soft
