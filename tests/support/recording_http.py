"""Test-only: a real HTTP server on 127.0.0.1 (port 0) that records every request and lets a
subclass answer it. The scripted OpenAI and Anthropic servers are its two subclasses."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when it is not JSON
    at: float = field(default_factory=time.time)


class RecordingServer:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def answer(self, reply: Reply, request: RecordedRequest) -> None:
        """Answer one recorded request through `reply`."""
        raise NotImplementedError

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class Reply:
    """How a `RecordingServer.answer` writes its response."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self._handler = handler

    def empty(self, status: int) -> None:
        self._handler.send_response(status)
        self._handler.send_header("content-length", "0")
        self._handler.end_headers()

    def json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        handler = self._handler
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def sse(self, events: Iterable[bytes]) -> None:
        handler = self._handler
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        handler.send_header("connection", "close")
        handler.end_headers()
        for event in events:
            handler.wfile.write(event)
            handler.wfile.flush()
        handler.close_connection = True


def _handler_for(server: RecordingServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def _read_body(self) -> Any:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
            try:
                return json.loads(raw) if raw else None
            except json.JSONDecodeError:
                return raw

        def _handle(self) -> None:
            body = self._read_body() if self.command in ("POST", "PUT", "PATCH") else None
            request = RecordedRequest(self.command, self.path, dict(self.headers), body)
            server.record(request)
            server.answer(Reply(self), request)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = _handle

    return Handler
