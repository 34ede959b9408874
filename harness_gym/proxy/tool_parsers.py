"""Turn the model's streamed text into answer text and tool calls.

Parsers are incremental: `feed()` takes each detokenized delta as it is sampled and returns what
can already be sent to the client, so text streams while tool calls are buffered until closed.
The same parser runs for streamed and non-streamed answers, so both carry identical content.

Whitespace is held back until non-whitespace text follows: the newlines a model puts around
`<tool_call>` blocks are not content, and dropping them in both modes keeps answers equal.
"""

from __future__ import annotations

import secrets
from typing import Protocol

import orjson

from .canonical import ToolCall
from .events import ParseEvent, TextDelta, ToolCallDone


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[ParseEvent]: ...

    def finish(self) -> list[ParseEvent]: ...


class HermesToolCallParser:
    """Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    A block whose body is not a JSON object with a string `name` stays text, verbatim, so a
    malformed call reaches the client as what the model wrote rather than vanishing.
    """

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False
        self._pending_space = ""

    def feed(self, text: str) -> list[ParseEvent]:
        self._buffer += text
        events: list[ParseEvent] = []
        while True:
            if self._inside:
                end = self._buffer.find(self.close_tag)
                if end < 0:
                    return events
                body = self._buffer[:end]
                self._buffer = self._buffer[end + len(self.close_tag) :]
                self._inside = False
                call = parse_hermes_body(body)
                if call is None:
                    self._emit_text(self.open_tag + body + self.close_tag, events)
                else:
                    self._pending_space = ""
                    events.append(ToolCallDone(call))
            else:
                start = self._buffer.find(self.open_tag)
                if start >= 0:
                    self._emit_text(self._buffer[:start], events)
                    self._buffer = self._buffer[start + len(self.open_tag) :]
                    self._inside = True
                    continue
                keep = _partial_tag_suffix(self._buffer, self.open_tag)
                self._emit_text(self._buffer[: len(self._buffer) - keep], events)
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return events

    def finish(self) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        rest = (self.open_tag if self._inside else "") + self._buffer
        self._buffer, self._inside = "", False
        self._emit_text(rest, events)
        return events

    def _emit_text(self, text: str, events: list[ParseEvent]) -> None:
        if not text:
            return
        stripped = text.rstrip()
        if not stripped:
            self._pending_space += text
            return
        events.append(TextDelta(self._pending_space + stripped))
        self._pending_space = text[len(stripped) :]


def parse_hermes_body(body: str) -> ToolCall | None:
    try:
        obj = orjson.loads(body.strip())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # Blank means "no arguments", as clients read it when they echo the call back.
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            pass
    return ToolCall(id=new_tool_call_id(), name=obj["name"], arguments=arguments)


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


TOOL_CALL_PARSERS: dict[str, type[HermesToolCallParser]] = {"hermes": HermesToolCallParser}


def tool_call_open_tag(name: str) -> str:
    """The text every tool call of format `name` starts with (what `tool_choice` forces)."""
    make_tool_call_parser(name)  # the same error for an unknown format
    return TOOL_CALL_PARSERS[name].open_tag


def make_tool_call_parser(name: str) -> ToolCallParser:
    try:
        return TOOL_CALL_PARSERS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r}; known: {sorted(TOOL_CALL_PARSERS)}"
        ) from None
