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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .recording_http import RecordedRequest, RecordingServer, Reply


@dataclass
class Turn:
    """One scripted assistant turn: text, or a single tool call (`tool` + JSON `arguments`)."""

    text: str | None = None
    tool: str | None = None
    arguments: str = "{}"


Script = Callable[[dict[str, Any]], Turn]


def shell_then_done(tool: str, command: str, final: str = "done") -> Script:
    """First a call to the shell tool `tool` running `command`; once a tool result is in the
    history, the final text `final`."""

    def script(body: dict[str, Any]) -> Turn:
        if any(m.get("role") == "tool" for m in body.get("messages", [])):
            return Turn(text=final)
        return Turn(tool=tool, arguments=json.dumps({"command": command}))

    return script


class ScriptedChatServer(RecordingServer):
    def __init__(
        self, script: Script, model: str = "scripted", route: str = "/v1/chat/completions"
    ) -> None:
        super().__init__()
        self.script = script
        self.model = model
        self.route = route

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.split("?")[0] == self.route]

    def answer(self, reply: Reply, request: RecordedRequest) -> None:
        body = request.body
        if request.method == "POST" and request.path.split("?")[0] == self.route:
            turn = self.script(body)
            if body.get("stream"):
                reply.sse([f"data: {json.dumps(chunk)}\n\n".encode()
                           for chunk in _chunks(turn, self.model, body)]
                          + [b"data: [DONE]\n\n"])
            else:
                reply.json(200, _completion(turn, self.model))
        else:
            error = {"message": f"no route {request.path}", "type": "invalid_request_error"}
            reply.json(404, {"error": error})


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
