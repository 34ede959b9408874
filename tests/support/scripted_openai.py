"""A scripted OpenAI Chat Completions server for testing real harness CLIs without the proxy.

It binds 127.0.0.1 on port 0, records every request it gets (method, path, headers, JSON body),
and answers `POST /v1/chat/completions` (its `route`) from a script: a function of the request
body that returns the assistant's turn (text, or one tool call). It streams when asked
(`stream: true`) the way OpenAI does: a role delta, content or tool-call deltas (arguments split
in two pieces, so the client must accumulate), a finish chunk, a usage chunk when
`stream_options` asks, and `data: [DONE]`. Every other path gets a 404 in OpenAI's error shape
and is recorded too, so a test sees a CLI's probe requests.

>>> with ScriptedChatServer(shell_then_done("bash", "echo hi")) as server:
...     server.base_url  # doctest: +SKIP
'http://127.0.0.1:40123'
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Turn:
    """One scripted assistant turn: text, or a single tool call (`tool` + JSON `arguments`)."""

    text: str | None = None
    tool: str | None = None
    arguments: str = "{}"


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when it is not JSON
    at: float = field(default_factory=time.time)


Script = Callable[[dict[str, Any]], Turn]


def shell_then_done(tool: str, command: str, final: str = "done") -> Script:
    """First a call to the shell tool `tool` running `command`; once a tool result is in the
    history, the final text `final`."""

    def script(body: dict[str, Any]) -> Turn:
        if any(m.get("role") == "tool" for m in body.get("messages", [])):
            return Turn(text=final)
        return Turn(tool=tool, arguments=json.dumps({"command": command}))

    return script


class ScriptedChatServer:
    def __init__(
        self, script: Script, model: str = "scripted", route: str = "/v1/chat/completions"
    ) -> None:
        self.script = script
        self.model = model
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

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.split("?")[0] == self.route]

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def __enter__(self) -> ScriptedChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler_for(server: ScriptedChatServer) -> type[BaseHTTPRequestHandler]:
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
            server.record(RecordedRequest(self.command, self.path, dict(self.headers), body))
            if self.command == "POST" and self.path.split("?")[0] == server.route:
                turn = server.script(body)
                if body.get("stream"):
                    self._stream(turn, body)
                else:
                    self._json(200, _completion(turn, server.model))
            else:
                error = {"message": f"no route {self.path}", "type": "invalid_request_error"}
                self._json(404, {"error": error})

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = _handle

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, turn: Turn, body: dict[str, Any]) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            for chunk in _chunks(turn, server.model, body):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _completion(turn: Turn, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    finish = "stop"
    if turn.tool:
        message["tool_calls"] = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": turn.tool, "arguments": turn.arguments},
            }
        ]
        finish = "tool_calls"
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": _usage(),
    }


def _chunks(turn: Turn, model: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    if turn.tool:
        half = len(turn.arguments) // 2
        head = {"index": 0, "id": "call_1", "type": "function"}
        first = {**head, "function": {"name": turn.tool, "arguments": ""}}
        out.append(chunk({"tool_calls": [first]}))
        for piece in (turn.arguments[:half], turn.arguments[half:]):
            out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
        out.append(chunk({}, "tool_calls"))
    else:
        text = turn.text or ""
        for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
            out.append(chunk({"content": piece}))
        out.append(chunk({}, "stop"))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append({**chunk({}), "choices": [], "usage": _usage()})
    return out
