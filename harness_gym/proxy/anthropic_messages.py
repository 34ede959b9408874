"""Anthropic Messages: request -> canonical, the model's events -> message JSON or SSE events.

Claude Code's quirks (harnesses/): a `role: "system"` message inside `messages`,
`thinking` blocks echoed back (ours carry a signature the bridge checks: `reasoning`),
`cache_control` on every other block, `context_management`, `output_config` and beta headers;
it always streams, and it compacts its history only when a 400 says
`prompt is too long: N tokens > M maximum`.

Tool results become canonical `tool` messages, one per `tool_result` block and in order; text
blocks sent beside them follow as one user message. The answer's tool ids are `toolu_...`; the
bridge's semantic key ignores ids, so the echoed turn still extends the segment.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from .canonical import ChatRequest, Message, ReasoningPart, SamplingRequest, ToolCall, ToolSpec
from .errors import ProxyError, invalid
from .events import (
    AnswerEvent,
    CallFinished,
    ReasoningDelta,
    ReasoningDone,
    TextDelta,
    ToolCallDone,
)
from .images import ImagePart, Part, parts_with_images, text_with_placeholders
from .message_cache import NO_CACHE, MessageParseCache, NoCache
from .tool_choice import anthropic_tool_choice
from .wire import field, number_in

# --- request -----------------------------------------------------------------------------


def parse_messages_request(
    body: dict[str, Any],
    cache: MessageParseCache | NoCache = NO_CACHE,
    *,
    require_max_tokens: bool = True,
) -> ChatRequest:
    """`require_max_tokens=False` for `/v1/messages/count_tokens`, whose body has none.
    `cache`: the session's parsed messages (only new ones are parsed; see `message_cache`)."""
    messages: list[Message] = []
    system = field(body, "system", (str, list), "system")
    if system is not None:
        messages.append(Message("system", _text_of(system, "system")))
    raw_messages = field(body, "messages", list, "messages", required=True)
    if not raw_messages:
        raise invalid("messages: at least one message is required", "messages")
    for i, raw in enumerate(raw_messages):
        messages.extend(cache.parse(raw, f"messages[{i}]", _parse_message))
    tools = tuple(
        spec
        for i, raw in enumerate(field(body, "tools", list, "tools", default=[]))
        if (spec := _parse_tool(raw, f"tools[{i}]")) is not None
    )
    tool_choice = anthropic_tool_choice(body.get("tool_choice"), [t.name for t in tools])
    field(body, "metadata", dict, "metadata")
    max_tokens = field(body, "max_tokens", int, "max_tokens", required=require_max_tokens)
    if max_tokens is not None and max_tokens < 1:
        raise invalid("max_tokens: must be greater than or equal to 1", "max_tokens")
    stops = field(body, "stop_sequences", list, "stop_sequences", default=[])
    if not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop_sequences: expected an array of non-empty strings", "stop_sequences")
    top_k = field(body, "top_k", int, "top_k")
    sampling = SamplingRequest(
        max_tokens=max_tokens,
        temperature=number_in(field(body, "temperature", float, "temperature"), 0, 1, "temperature"),
        top_p=number_in(field(body, "top_p", float, "top_p"), 1e-9, 1, "top_p"),
        top_k=None if top_k is None else max(0, top_k),
        stop=tuple(stops),
    )
    return ChatRequest(
        messages=tuple(messages),
        tools=tools,
        sampling=sampling,
        stream=field(body, "stream", bool, "stream", default=False),
        model=field(body, "model", str, "model", default=""),
        tool_choice=tool_choice,
    )


def _parse_message(raw: Any, param: str) -> tuple[Message, ...]:
    return tuple(_parse_message_blocks(raw, param))


def _parse_message_blocks(raw: Any, param: str) -> list[Message]:
    if not isinstance(raw, dict):
        raise invalid(f"{param}: expected an object", param)
    role = field(raw, "role", str, f"{param}.role", required=True)
    if role not in ("user", "assistant", "system"):
        raise invalid(
            f"{param}.role: Input should be 'user' or 'assistant' (got {role!r})", f"{param}.role"
        )
    content = field(raw, "content", (str, list), f"{param}.content", required=True)
    if role == "system":  # Claude Code sends one inside `messages`
        return [Message("system", _text_of(content, f"{param}.content"))]
    if isinstance(content, str):
        return [Message(role, content)]
    texts: list[Part] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    reasoning: list[ReasoningPart] = []
    for j, block in enumerate(content):
        where = f"{param}.content[{j}]"
        if isinstance(block, str):  # lenient: a bare string is a text block
            texts.append(block)
            continue
        if not isinstance(block, dict):
            raise invalid(f"{where}: expected a content block object", where)
        kind = field(block, "type", str, f"{where}.type", required=True)
        if kind == "text":
            texts.append(field(block, "text", str, f"{where}.text", required=True))
        elif kind == "thinking" and role == "assistant":
            reasoning.append(ReasoningPart(
                field(block, "thinking", str, f"{where}.thinking", default=""),
                field(block, "signature", str, f"{where}.signature", default="")))
        elif kind == "redacted_thinking" and role == "assistant":
            # We never redact: such a block in a turn of ours is an alteration (its empty
            # signature never verifies).
            reasoning.append(ReasoningPart(
                field(block, "data", str, f"{where}.data", default=""), ""))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind == "tool_use" and role == "assistant":
            calls.append(
                ToolCall(
                    id=field(block, "id", str, f"{where}.id", default=""),
                    name=field(block, "name", str, f"{where}.name", required=True),
                    arguments=field(block, "input", dict, f"{where}.input", default={}),
                )
            )
        elif kind == "tool_result" and role == "user":
            parts = _tool_result_parts(block.get("content") or "", f"{where}.content")
            results.append(
                Message(
                    "tool",
                    text_with_placeholders(parts),
                    tool_call_id=field(block, "tool_use_id", str, f"{where}.tool_use_id",
                                       required=True),
                    parts=parts_with_images(parts),
                )
            )
            field(block, "is_error", bool, f"{where}.is_error")
        elif kind in ("image", "document") and role == "user":
            texts.append(_image_part(block, kind, where))
        else:
            raise invalid(f"{where}.type: unsupported content block type {kind!r} in a {role} "
                          "message", f"{where}.type")
    text = text_with_placeholders(texts)
    if role == "assistant":
        return [Message("assistant", text, tuple(calls), reasoning=tuple(reasoning))]
    user = Message("user", text, parts=parts_with_images(texts))
    if results:
        return results + ([user] if texts else [])
    return [user]


def _tool_result_parts(content: Any, param: str) -> list[Part]:
    """A tool result's text and images (Claude Code's `Read` of a PNG is an image block)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise invalid(f"{param}: expected a string or an array of content blocks", param)
    parts: list[Part] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(block, dict):
            raise invalid(f"{where}: expected a content block object", where)
        kind = field(block, "type", str, f"{where}.type", required=True)
        if kind in ("image", "document"):
            parts.append(_image_part(block, kind, where))
        elif kind == "text":
            parts.append(field(block, "text", str, f"{where}.text", required=True))
        else:
            raise invalid(f"{where}: '{kind}' blocks are not supported in a tool result",
                          f"{where}.type")
    return parts


def _image_part(block: dict[str, Any], kind: str, where: str) -> ImagePart:
    """An `image` or `document` block: `source` is base64 data, a URL, or (documents) text or
    content blocks."""
    source = field(block, "source", dict, f"{where}.source", required=True)
    source_kind = field(source, "type", str, f"{where}.source.type", required=True)
    media_type = field(source, "media_type", str, f"{where}.source.media_type", default="")
    if source_kind == "url":
        return ImagePart(media_type, url=field(source, "url", str, f"{where}.source.url",
                                                 required=True), kind=kind)
    if source_kind in ("base64", "text"):
        data = field(source, "data", str, f"{where}.source.data", required=True)
        return ImagePart(media_type, data, kind=kind)
    if source_kind in ("content", "file"):  # a document made of blocks, an uploaded file
        return ImagePart(media_type, url=f"{source_kind}:{orjson.dumps(source).decode()}",
                         kind=kind)
    raise invalid(f"{where}.source.type: expected 'base64', 'url', 'text', 'content' or 'file' "
                  f"for a {kind} block, got {source_kind!r}", f"{where}.source.type")



def _text_of(content: Any, param: str) -> str:
    """A string, or the text of a list of text blocks (system prompts, tool results)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{param}: expected a string or an array of text blocks", param)
    texts = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(block, dict):
            raise invalid(f"{where}: expected a content block object", where)
        kind = field(block, "type", str, f"{where}.type", required=True)
        if kind != "text":
            raise invalid(f"{where}: '{kind}' blocks are not supported here: text only",
                          f"{where}.type")
        texts.append(field(block, "text", str, f"{where}.text", required=True))
    return "\n".join(texts) if param == "system" else "".join(texts)


def _parse_tool(raw: Any, param: str) -> ToolSpec | None:
    """A custom tool, or None for Anthropic's server tools (web search, code execution...):
    they have no schema a local model could call, so they are left out of the prompt."""
    if not isinstance(raw, dict):
        raise invalid(f"{param}: expected an object", param)
    kind = field(raw, "type", str, f"{param}.type", default="custom")
    name = field(raw, "name", str, f"{param}.name", required=True)
    if kind != "custom" and "input_schema" not in raw:
        return None
    return ToolSpec(
        name=name,
        description=field(raw, "description", str, f"{param}.description", default=""),
        parameters=field(raw, "input_schema", dict, f"{param}.input_schema", required=True),
    )


# --- response ----------------------------------------------------------------------------

_STOP_REASONS = {"stop": "end_turn", "abort": "end_turn", "length": "max_tokens",
                 "tool_calls": "tool_use"}


def message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def tool_use_id(call: ToolCall) -> str:
    return "toolu_" + (call.id.removeprefix("call_") or secrets.token_hex(12))


def tool_input(call: ToolCall) -> dict[str, Any]:
    """Anthropic's `input` is an object; arguments the model wrote as anything else are kept
    under `arguments` so the CLI sees them (and can complain) rather than losing them."""
    return call.arguments if isinstance(call.arguments, dict) else {"arguments": call.arguments}


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessageWriter:
    """Turns one call's events into Anthropic content blocks: as SSE events while streaming
    (`start`, `feed`, `finish`), and as the final message JSON (`message`). Both answers are
    built by the same code, so they carry the same blocks."""

    def __init__(self, model: str, prompt_tokens: int) -> None:
        self.id = message_id()
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.blocks: list[dict[str, Any]] = []
        self._text_open = False
        self._thinking_open = False
        self._done: CallFinished | None = None

    def _usage(self, output_tokens: int) -> dict[str, int]:
        return {"input_tokens": self.prompt_tokens, "output_tokens": output_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

    def start(self) -> bytes:
        head = {"id": self.id, "type": "message", "role": "assistant", "content": [],
                "model": self.model, "stop_reason": None, "stop_sequence": None,
                "usage": self._usage(0)}
        return _sse("message_start", {"type": "message_start", "message": head}) + _sse(
            "ping", {"type": "ping"}
        )

    def feed(self, event: AnswerEvent) -> bytes:
        if isinstance(event, (ReasoningDelta, ReasoningDone)):
            return self._thinking(event)
        if isinstance(event, TextDelta):
            if not event.text:
                return b""
            out = b""
            if not self._text_open:
                out = self._close_text()
                self.blocks.append({"type": "text", "text": ""})
                self._text_open = True
                out += _sse("content_block_start", {"type": "content_block_start",
                                                    "index": len(self.blocks) - 1,
                                                    "content_block": {"type": "text", "text": ""}})
            self.blocks[-1]["text"] += event.text
            return out + _sse("content_block_delta", {
                "type": "content_block_delta", "index": len(self.blocks) - 1,
                "delta": {"type": "text_delta", "text": event.text}})
        if isinstance(event, ToolCallDone):
            out = self._close_text()
            call = event.call
            block = {"type": "tool_use", "id": tool_use_id(call), "name": call.name,
                     "input": tool_input(call)}
            self.blocks.append(block)
            index = len(self.blocks) - 1
            return out + b"".join((
                _sse("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {**block, "input": {}}}),
                _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "input_json_delta",
                                                       "partial_json": orjson.dumps(
                                                           block["input"]).decode()}}),
                _sse("content_block_stop", {"type": "content_block_stop", "index": index}),
            ))
        self._done = event
        out = self._close_text()
        return out + _sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(), "stop_sequence": event.stop_sequence},
            "usage": {"output_tokens": event.completion_tokens},
        }) + _sse("message_stop", {"type": "message_stop"})

    def _thinking(self, event: ReasoningDelta | ReasoningDone) -> bytes:
        """A `thinking` block: its text streams as `thinking_delta`s; our signature of it comes
        as a `signature_delta` once the reasoning is over (reasoning always comes first)."""
        index = len(self.blocks) - 1
        if isinstance(event, ReasoningDone):
            if not self._thinking_open:
                return b""
            self._thinking_open = False
            self.blocks[-1]["signature"] = event.signature
            return _sse("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "signature_delta", "signature": event.signature}},
            ) + _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        if not event.text:
            return b""
        out = b""
        if not self._thinking_open:
            self.blocks.append({"type": "thinking", "thinking": "", "signature": ""})
            self._thinking_open = True
            index += 1
            out = _sse("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": dict(self.blocks[-1])})
        self.blocks[-1]["thinking"] += event.text
        return out + _sse("content_block_delta", {
            "type": "content_block_delta", "index": index,
            "delta": {"type": "thinking_delta", "thinking": event.text}})

    def _close_text(self) -> bytes:
        if not self._text_open:
            return b""
        self._text_open = False
        return _sse("content_block_stop", {"type": "content_block_stop",
                                           "index": len(self.blocks) - 1})

    def _stop_reason(self) -> str:
        assert self._done is not None
        if self._done.stop_sequence is not None and not self._done.turn.tool_calls:
            return "stop_sequence"
        return _STOP_REASONS[self._done.turn.finish_reason]

    def keepalive(self) -> bytes:
        return _sse("ping", {"type": "ping"})

    def error_event(self, error: ProxyError) -> bytes:
        return error_event(error)

    def body(self) -> dict[str, Any]:
        assert self._done is not None, "body() needs the call's CallFinished"
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": self.blocks, "stop_reason": self._stop_reason(),
                "stop_sequence": self._done.stop_sequence,
                "usage": self._usage(self._done.completion_tokens)}


# --- errors ------------------------------------------------------------------------------

_ERRORS = {
    "invalid_request": ("invalid_request_error", 400),
    "context_length": ("invalid_request_error", 400),
    "authentication": ("authentication_error", 401),
    "forbidden": ("permission_error", 403),
    "not_found": ("not_found_error", 404),
    "too_large": ("request_too_large", 413),
    "rate_limited": ("rate_limit_error", 429),
    "overloaded": ("overloaded_error", 529),  # Anthropic's retriable "Overloaded"
    "internal": ("api_error", 500),
}


def error_status(error: ProxyError) -> int:
    return _ERRORS[error.kind][1]


def error_body(error: ProxyError) -> dict[str, Any]:
    message = error.message
    if error.kind == "context_length":
        # The text Claude Code matches to compact its history.
        message = f"prompt is too long: {error.prompt_tokens} tokens > {error.max_context} maximum"
    return {"type": "error", "error": {"type": _ERRORS[error.kind][0], "message": message}}


def error_event(error: ProxyError) -> bytes:
    """An error after the stream started: the SDK raises on an `error` event."""
    return _sse("error", error_body(error))
