"""OpenAI Chat Completions: request -> canonical, canonical answer -> JSON or SSE chunks.

The real CLIs' quirks (harnesses/): user content as a list of text parts (Pi),
`content: null` or `""` on tool-call turns (Pi, OpenCode), tool results as JSON strings
(Hermes), `developer` as a synonym of `system`. A thinking policy's reasoning goes out as
`reasoning_content` (vLLM's and DeepSeek's field) and is read back from it or `reasoning`.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

from .canonical import (
    ROLES,
    AssistantTurn,
    ChatRequest,
    Message,
    ReasoningPart,
    SamplingRequest,
    ToolCall,
    ToolSpec,
)
from .errors import ProxyError, invalid
from .events import (
    AnswerEvent,
    CallFinished,
    ReasoningDelta,
    ReasoningDone,
    TextDelta,
    ToolCallDone,
)
from .images import Part, from_data_url, parts_with_images, text_with_placeholders
from .message_cache import NO_CACHE, MessageParseCache, NoCache
from .tool_choice import openai_tool_choice
from .wire import field, number_in

# --- request -----------------------------------------------------------------------------


def parse_chat_request(
    body: dict[str, Any], cache: MessageParseCache | NoCache = NO_CACHE
) -> ChatRequest:
    """`cache`: the session's parsed messages (only new ones are parsed; see `message_cache`)."""
    raw_messages = field(body, "messages", list, "messages", required=True)
    if not raw_messages:
        raise invalid("'messages' must contain at least one message.", "messages")
    messages = tuple(cache.parse(m, f"messages[{i}]", _parse_message)
                     for i, m in enumerate(raw_messages))
    tools = tuple(
        _parse_tool(t, f"tools[{i}]")
        for i, t in enumerate(field(body, "tools", list, "tools", default=[]))
    )
    n = field(body, "n", int, "n", default=1)
    if n != 1:
        raise invalid("Only n=1 is supported: each call is one sampled trajectory.", "n")
    max_tokens = field(body, "max_completion_tokens", int, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = field(body, "max_tokens", int, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise invalid("Invalid 'max_tokens': must be at least 1.", "max_tokens")
    stop = field(body, "stop", (str, list), "stop", default=())
    if isinstance(stop, str):
        stop = (stop,)
    if not all(isinstance(s, str) and s for s in stop):
        raise invalid("Invalid 'stop': expected a string or an array of non-empty strings.", "stop")
    stream_options = field(body, "stream_options", dict, "stream_options", default={})
    top_k = field(body, "top_k", int, "top_k")
    if top_k is not None and top_k < 0:
        top_k = 0  # vLLM's -1 means "disabled", as does our 0
    sampling = SamplingRequest(
        max_tokens=max_tokens,
        temperature=number_in(field(body, "temperature", float, "temperature"), 0, 2, "temperature"),
        top_p=number_in(field(body, "top_p", float, "top_p"), 1e-9, 1, "top_p"),
        top_k=top_k,
        seed=field(body, "seed", int, "seed"),
        stop=tuple(stop),
    )
    return ChatRequest(
        messages=messages,
        tools=tools,
        sampling=sampling,
        stream=field(body, "stream", bool, "stream", default=False),
        include_usage=field(
            stream_options, "include_usage", bool, "stream_options.include_usage", default=False
        ),
        model=field(body, "model", str, "model", default=""),
        tool_choice=openai_tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"),
                                       [t.name for t in tools]),
    )


def _parse_message(raw: Any, param: str) -> Message:
    if not isinstance(raw, dict):
        raise invalid(f"Invalid type for '{param}': expected an object.", param)
    role = field(raw, "role", str, f"{param}.role", required=True)
    if role == "developer":
        role = "system"
    if role not in ROLES:
        raise invalid(
            f"Invalid value for '{param}.role': '{role}'. Supported values are: "
            "'system', 'developer', 'user', 'assistant' and 'tool'.",
            f"{param}.role",
        )
    parts = _parse_content(raw.get("content"), f"{param}.content")
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: tuple[ReasoningPart, ...] = ()
    if role == "assistant":
        raw_calls = field(raw, "tool_calls", list, f"{param}.tool_calls", default=[])
        tool_calls = tuple(
            _parse_tool_call(c, f"{param}.tool_calls[{i}]") for i, c in enumerate(raw_calls)
        )
        reasoning = _parse_reasoning(raw, param)
    tool_call_id = None
    if role == "tool":
        tool_call_id = field(raw, "tool_call_id", str, f"{param}.tool_call_id", required=True)
    name = field(raw, "name", str, f"{param}.name")
    return Message(role, text_with_placeholders(parts), tool_calls, tool_call_id,
                   name if role != "assistant" else None, parts=parts_with_images(parts),
                   reasoning=reasoning)


def _parse_reasoning(raw: dict[str, Any], param: str) -> tuple[ReasoningPart, ...]:
    """An assistant turn's echoed reasoning: `reasoning_content` (what we send; vLLM, DeepSeek)
    or `reasoning` (newer vLLM). Unsigned: chat has no place for a signature."""
    for key in ("reasoning_content", "reasoning"):
        text = field(raw, key, str, f"{param}.{key}")
        if text is not None:
            return (ReasoningPart(text),)
    return ()


def _parse_content(raw: Any, param: str) -> list[Part]:
    """Text parts, and `image_url` parts (kept as images; see `images`)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        raise invalid(
            f"Invalid type for '{param}': expected a string or an array of content parts.", param
        )
    texts: list[Part] = []
    for i, part in enumerate(raw):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise invalid(f"Invalid type for '{param}[{i}]': expected an object.", f"{param}[{i}]")
        kind = part.get("type", "text")
        if kind == "image_url":
            image = field(part, "image_url", (dict, str), f"{param}[{i}].image_url", required=True)
            url = image if isinstance(image, str) else field(
                image, "url", str, f"{param}[{i}].image_url.url", required=True)
            texts.append(from_data_url(url))
            continue
        if kind not in ("text", "input_text", "output_text"):
            raise invalid(
                f"Unsupported content part type '{kind}' in '{param}[{i}]': this model takes "
                "text only.",
                f"{param}[{i}].type",
            )
        texts.append(field(part, "text", str, f"{param}[{i}].text", required=True))
    return texts


def _parse_tool_call(raw: Any, param: str) -> ToolCall:
    if not isinstance(raw, dict):
        raise invalid(f"Invalid type for '{param}': expected an object.", param)
    function = field(raw, "function", dict, f"{param}.function", required=True)
    arguments = field(function, "arguments", (str, dict), f"{param}.function.arguments", default="")
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            pass  # kept verbatim: the model may have written malformed JSON
    return ToolCall(
        id=field(raw, "id", str, f"{param}.id", default=""),
        name=field(function, "name", str, f"{param}.function.name", required=True),
        arguments=arguments,
    )


def _parse_tool(raw: Any, param: str) -> ToolSpec:
    if not isinstance(raw, dict):
        raise invalid(f"Invalid type for '{param}': expected an object.", param)
    kind = field(raw, "type", str, f"{param}.type", default="function")
    if kind != "function":
        raise invalid(f"Unsupported tool type '{kind}' in '{param}': only 'function'.", param)
    function = field(raw, "function", dict, f"{param}.function", required=True)
    return ToolSpec(
        name=field(function, "name", str, f"{param}.function.name", required=True),
        description=field(function, "description", str, f"{param}.function.description", default=""),
        parameters=field(function, "parameters", dict, f"{param}.function.parameters", default={}),
    )


# --- response ----------------------------------------------------------------------------


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def _tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json()},
    }
    if index is not None:
        out = {"index": index, **out}
    return out


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    call_id: str, model: str, turn: AssistantTurn, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    if turn.tool_calls:
        message["tool_calls"] = [_tool_call_json(c) for c in turn.tool_calls]
    elif not turn.content:
        message["content"] = ""
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish_reason(turn),
            }
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _finish_reason(turn: AssistantTurn) -> str:
    return "stop" if turn.finish_reason == "abort" else turn.finish_reason


class ChatWriter:
    """One answer in Chat Completions form: `chat.completion.chunk` SSE events while streaming
    (`start`, `feed`), the `chat.completion` object otherwise (`body`); the same events feed
    both, so streamed and plain answers agree."""

    def __init__(self, model: str, include_usage: bool = False) -> None:
        self.id = completion_id()
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self._n_tool_calls = 0
        self._done: CallFinished | None = None

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self._event(
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        )

    def start(self) -> bytes:
        return self._delta({"role": "assistant", "content": ""})

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"  # an SSE comment: clients skip it, idle timers reset

    def feed(self, event: AnswerEvent) -> bytes:
        if isinstance(event, ReasoningDelta):
            return self._delta({"reasoning_content": event.text})
        if isinstance(event, ReasoningDone):
            return b""  # chat has no signature to send
        if isinstance(event, TextDelta):
            return self._delta({"content": event.text})
        if isinstance(event, ToolCallDone):
            index = self._n_tool_calls
            self._n_tool_calls += 1
            return self._delta({"tool_calls": [_tool_call_json(event.call, index)]})
        self._done = event
        out = self._delta({}, _finish_reason(event.turn))
        if self.include_usage:
            out += self._event([], usage=_usage(event.prompt_tokens, event.completion_tokens))
        return out + b"data: [DONE]\n\n"

    def body(self) -> dict[str, Any]:
        assert self._done is not None, "body() needs the call's CallFinished"
        done = self._done
        return chat_completion(self.id, self.model, done.turn, done.prompt_tokens,
                               done.completion_tokens)

    def error_event(self, error: ProxyError) -> bytes:
        """An error after the stream started: the OpenAI SDK raises on a chunk holding `error`."""
        return b"data: " + orjson.dumps(error_body(error)) + b"\n\n"


# --- errors ------------------------------------------------------------------------------

_ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "forbidden": ("invalid_request_error", "forbidden"),
    "not_found": ("invalid_request_error", "not_found"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limited": ("requests", "rate_limit_exceeded"),
    "overloaded": ("server_error", "overloaded"),
    "internal": ("server_error", None),
}


def error_body(error: ProxyError) -> dict[str, Any]:
    kind, code = _ERROR_TYPES[error.kind]
    message = error.message
    if error.kind == "context_length":
        # The wording OpenAI-compatible CLIs match to decide to compact their history.
        message = (
            f"This model's maximum context length is {error.max_context} tokens. However, your "
            f"messages resulted in {error.prompt_tokens} tokens. Please reduce the length of the "
            "messages."
        )
    return {"error": {"message": message, "type": kind, "param": error.param, "code": code}}
