"""A scripted Anthropic Messages server for testing Claude Code without the proxy.

It binds 127.0.0.1 on port 0, records every request (method, path, headers, JSON body), answers
`HEAD /` with 200 (Claude Code's reachability check) and `POST /v1/messages` (query string
ignored: Claude Code sends `?beta=true`) from a script: a function of the request body that
returns the assistant's turn, text or one tool_use. It streams when asked the way Anthropic
does: `message_start`, `content_block_start`/`content_block_delta`/`content_block_stop` (tool
input as two `input_json_delta` pieces, so the client must accumulate), `message_delta` with the
stop reason, `message_stop`. Every other path gets a 404 in Anthropic's error shape.

>>> with ScriptedMessagesServer(shell_then_done("Bash", "echo hi")) as server:
...     server.base_url  # doctest: +SKIP
'http://127.0.0.1:40123'
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .scripted_openai import RecordedRequest, Turn

Script = Callable[[dict[str, Any]], Turn]


def shell_then_done(tool: str, command: str, final: str = "done") -> Script:
    """First a tool_use of `tool` running `command`; once a tool_result is in the history,
    the final text `final`."""

    def script(body: dict[str, Any]) -> Turn:
        for message in body.get("messages", []):
            content = message.get("content")
            if isinstance(content, list) and any(
                isinstance(part, dict) and part.get("type") == "tool_result" for part in content
            ):
                return Turn(text=final)
        return Turn(tool=tool, arguments=json.dumps({"command": command}))

    return script


class ScriptedMessagesServer:
    def __init__(self, script: Script, route: str = "/v1/messages") -> None:
        self.script = script
        self.route = route
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def message_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests
                if r.method == "POST" and r.path.split("?")[0] == self.route]

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def __enter__(self) -> ScriptedMessagesServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler_for(server: ScriptedMessagesServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _read_body(self) -> Any:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
            try:
                return json.loads(raw) if raw else None
            except json.JSONDecodeError:
                return raw

        def _handle(self) -> None:
            body = self._read_body() if self.command in ("POST", "PUT", "PATCH") else None
            server.record(RecordedRequest(self.command, self.path, dict(self.headers), body))
            path = self.path.split("?")[0]
            if self.command == "HEAD" and path == "/":
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
            elif self.command == "POST" and path == server.route and isinstance(body, dict):
                turn = server.script(body)
                if body.get("stream"):
                    self._stream(turn, body)
                else:
                    self._json(200, _message(turn, body))
            else:
                error = {"type": "not_found_error", "message": f"no route {self.path}"}
                self._json(404, {"type": "error", "error": error})

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = _handle

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _stream(self, turn: Turn, body: dict[str, Any]) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            for event in _events(turn, body):
                data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                self.wfile.write(data.encode())
                self.wfile.flush()
            self.close_connection = True

    return Handler


def _usage(output_tokens: int = 5) -> dict[str, int]:
    return {"input_tokens": 10, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _blocks(turn: Turn) -> list[dict[str, Any]]:
    if turn.tool:
        return [{"type": "tool_use", "id": "toolu_scripted1", "name": turn.tool,
                 "input": json.loads(turn.arguments)}]
    return [{"type": "text", "text": turn.text or ""}]


def _message(turn: Turn, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_scripted", "type": "message", "role": "assistant",
        "model": body.get("model", "scripted"), "content": _blocks(turn),
        "stop_reason": "tool_use" if turn.tool else "end_turn", "stop_sequence": None,
        "usage": _usage(),
    }


def _events(turn: Turn, body: dict[str, Any]) -> list[dict[str, Any]]:
    start = {**_message(turn, body), "content": [], "stop_reason": None, "usage": _usage(1)}
    out: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    if turn.tool:
        block = {"type": "tool_use", "id": "toolu_scripted1", "name": turn.tool, "input": {}}
        half = len(turn.arguments) // 2
        deltas = [{"type": "input_json_delta", "partial_json": piece}
                  for piece in (turn.arguments[:half], turn.arguments[half:])]
    else:
        block = {"type": "text", "text": ""}
        text = turn.text or ""
        deltas = [{"type": "text_delta", "text": piece}
                  for piece in (text[: len(text) // 2], text[len(text) // 2 :])]
    out.append({"type": "content_block_start", "index": 0, "content_block": block})
    out += [{"type": "content_block_delta", "index": 0, "delta": d} for d in deltas]
    out.append({"type": "content_block_stop", "index": 0})
    out.append({
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use" if turn.tool else "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    })
    out.append({"type": "message_stop"})
    return out
