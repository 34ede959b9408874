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
from collections.abc import Callable
from typing import Any

from .recording_http import RecordedRequest, RecordingServer, Reply
from .scripted_openai import Turn

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


class ScriptedMessagesServer(RecordingServer):
    def __init__(self, script: Script, route: str = "/v1/messages") -> None:
        super().__init__()
        self.script = script
        self.route = route

    def message_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests
                if r.method == "POST" and r.path.split("?")[0] == self.route]

    def answer(self, reply: Reply, request: RecordedRequest) -> None:
        body, path = request.body, request.path.split("?")[0]
        if request.method == "HEAD" and path == "/":
            reply.empty(200)
        elif request.method == "POST" and path == self.route and isinstance(body, dict):
            turn = self.script(body)
            if body.get("stream"):
                reply.sse(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
                          for e in _events(turn, body))
            else:
                reply.json(200, _message(turn, body))
        else:
            error = {"type": "not_found_error", "message": f"no route {request.path}"}
            reply.json(404, {"type": "error", "error": error})


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
