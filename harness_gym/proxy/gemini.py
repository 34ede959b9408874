"""Google's Gemini API: `generateContent` / `streamGenerateContent` bodies -> canonical, the
model's events -> `GenerateContentResponse` JSON or SSE chunks.

Gemini CLI's quirks (harnesses/gemini_cli.py): the model comes in the URL
(`/v1beta/models/{model}:streamGenerateContent?alt=sse`), the key in `x-goog-api-key` (or
`?key=`); a turn is `{"role": "user" | "model", "parts": [...]}`; the model's calls are
`functionCall` parts and their results `functionResponse` parts of the next user turn. The CLI
merges a streamed answer's text parts into one, drops `thought` parts from its history, and
rewrites our call ids to `NAME__ID`: the bridge's semantic key ignores ids, so the echoed turn
still extends the segment. It also stamps `thoughtSignature: "skip_thought_signature_validator"`
on the first function call of each turn; only a signature on a `thought` part is read as
reasoning (ours come on one), so that stamp is not taken for altered reasoning.

A `functionResponse` without an `id` answers the earliest unanswered call of that name in the
model turn before it, so ids are the same each time a history is resent. A stream is SSE of
`data: {chunk}` lines and nothing else: both Google SDKs (Python and the CLI's JavaScript one)
stop parsing at an SSE comment, so an idle wait sends no keep-alive.
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
from .tool_choice import AUTO, ToolChoice
from .wire import field, number_in

METHODS = ("generateContent", "streamGenerateContent", "countTokens")

# --- request -----------------------------------------------------------------------------


def parse_generate_request(body: dict[str, Any], *, model: str, stream: bool) -> ChatRequest:
    """A `generateContent` body (the model and streaming come from the URL)."""
    messages: list[Message] = []
    system = field(body, "systemInstruction", (dict, str), "systemInstruction")
    if system is not None:
        text = system if isinstance(system, str) else _system_text(system)
        messages.append(Message("system", text))
    contents = field(body, "contents", list, "contents", required=True)
    if not contents:
        raise invalid("* GenerateContentRequest.contents: contents is not specified", "contents")
    for i, raw in enumerate(contents):
        _add_content(messages, raw, f"contents[{i}]")
    tools = tuple(
        spec
        for i, raw in enumerate(field(body, "tools", list, "tools", default=[]))
        for spec in _parse_tool(raw, f"tools[{i}]")
    )
    return ChatRequest(
        messages=tuple(messages),
        tools=tools,
        sampling=_sampling(field(body, "generationConfig", dict, "generationConfig", default={})),
        stream=stream,
        model=model,
        tool_choice=_tool_choice(field(body, "toolConfig", dict, "toolConfig", default={}),
                                 [t.name for t in tools]),
    )


def parse_count_request(body: dict[str, Any], *, model: str) -> ChatRequest:
    """A `countTokens` body: `contents`, or a whole `generateContentRequest`."""
    inner = field(body, "generateContentRequest", dict, "generateContentRequest")
    return parse_generate_request(inner if inner is not None else body, model=model,
                                  stream=False)


def _system_text(content: dict[str, Any]) -> str:
    texts = []
    for j, part in enumerate(field(content, "parts", list, "systemInstruction.parts",
                                   required=True)):
        where = f"systemInstruction.parts[{j}]"
        if not isinstance(part, dict):
            raise invalid(f"Invalid value at '{where}': expected a Part object.", where)
        texts.append(field(part, "text", str, f"{where}.text", required=True))
    return "\n".join(texts)


def _add_content(messages: list[Message], raw: Any, param: str) -> None:
    if not isinstance(raw, dict):
        raise invalid(f"Invalid value at '{param}': expected a Content object.", param)
    role = field(raw, "role", str, f"{param}.role", default="user")
    if role not in ("user", "model", "function"):
        raise invalid(f"Please use a valid role: user, model (got {role!r} at '{param}.role').",
                      f"{param}.role")
    parts = field(raw, "parts", list, f"{param}.parts", required=True)
    texts: list[Part] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    reasoning: list[ReasoningPart] = []
    for j, part in enumerate(parts):
        where = f"{param}.parts[{j}]"
        if not isinstance(part, dict):
            raise invalid(f"Invalid value at '{where}': expected a Part object.", where)
        signature = field(part, "thoughtSignature", str, f"{where}.thoughtSignature")
        if "functionCall" in part and role == "model":
            calls.append(_function_call(part["functionCall"], f"{where}.functionCall",
                                        len(calls)))
        elif "functionResponse" in part and role != "model":
            results.append(_function_response(part["functionResponse"],
                                              f"{where}.functionResponse", messages, results))
        elif "text" in part:
            text = field(part, "text", str, f"{where}.text", required=True)
            if field(part, "thought", bool, f"{where}.thought", default=False):
                if role == "model":
                    reasoning.append(ReasoningPart(text, signature))
                continue
            texts.append(text)
        elif "inlineData" in part or "fileData" in part:
            texts.append(_blob(part, where))
        else:
            kinds = ", ".join(sorted(part)) or "nothing"
            raise invalid(f"Unsupported part at '{where}' (it holds {kinds}): supported are text, "
                          "functionCall, functionResponse, inlineData and fileData.", where)
    if role == "model":
        messages.append(Message("assistant", text_with_placeholders(texts), tuple(calls),
                                reasoning=tuple(r for r in reasoning if r.text or r.signature)))
        return
    messages.extend(results)
    if texts or not results:
        messages.append(Message("user", text_with_placeholders(texts, "\n"),
                                parts=parts_with_images(texts)))


def _function_call(raw: Any, param: str, index: int) -> ToolCall:
    if not isinstance(raw, dict):
        raise invalid(f"Invalid value at '{param}': expected a FunctionCall object.", param)
    return ToolCall(
        id=field(raw, "id", str, f"{param}.id", default="") or f"call_{index}",
        name=field(raw, "name", str, f"{param}.name", required=True),
        arguments=field(raw, "args", dict, f"{param}.args", default={}),
    )


def _function_response(
    raw: Any, param: str, messages: list[Message], answered: list[Message]
) -> Message:
    if not isinstance(raw, dict):
        raise invalid(f"Invalid value at '{param}': expected a FunctionResponse object.", param)
    name = field(raw, "name", str, f"{param}.name", required=True)
    response = field(raw, "response", dict, f"{param}.response", default={})
    call_id = field(raw, "id", str, f"{param}.id") or _call_id_for(name, messages, answered)
    return Message("tool", _response_text(response), tool_call_id=call_id, name=name)


def _call_id_for(name: str, messages: list[Message], answered: list[Message]) -> str:
    """The id of the earliest call named `name` in the last model turn not yet answered."""
    turn = messages[-1] if messages and messages[-1].role == "assistant" else None
    taken = {m.tool_call_id for m in answered}
    for call in turn.tool_calls if turn is not None else ():
        if call.name == name and call.id not in taken:
            return call.id
    return f"{name}_{len(answered)}"


def _response_text(response: dict[str, Any]) -> str:
    """What the model reads of a function's response: Gemini CLI's `{"output": TEXT}` as the
    text itself, anything else as its JSON."""
    if len(response) == 1:
        value = next(iter(response.values()))
        if isinstance(value, str) and next(iter(response)) in ("output", "content", "result"):
            return value
    return orjson.dumps(response).decode()


def _blob(part: dict[str, Any], where: str) -> ImagePart:
    if "inlineData" in part:
        data = field(part, "inlineData", dict, f"{where}.inlineData", required=True)
        return ImagePart(
            field(data, "mimeType", str, f"{where}.inlineData.mimeType", default=""),
            field(data, "data", str, f"{where}.inlineData.data", required=True),
            kind=_blob_kind(field(data, "mimeType", str, f"{where}.inlineData.mimeType",
                                  default="")))
    ref = field(part, "fileData", dict, f"{where}.fileData", required=True)
    media_type = field(ref, "mimeType", str, f"{where}.fileData.mimeType", default="")
    return ImagePart(media_type, url=field(ref, "fileUri", str, f"{where}.fileData.fileUri",
                                           required=True), kind=_blob_kind(media_type))


def _blob_kind(media_type: str) -> str:
    return "image" if media_type.startswith("image/") or not media_type else "document"


def _parse_tool(raw: Any, param: str) -> list[ToolSpec]:
    """A Tool's function declarations; Google's built-in tools (search, code execution, URL
    context) have no schema a local model could call, so they are left out of the prompt."""
    if not isinstance(raw, dict):
        raise invalid(f"Invalid value at '{param}': expected a Tool object.", param)
    specs = []
    for j, decl in enumerate(field(raw, "functionDeclarations", list,
                                   f"{param}.functionDeclarations", default=[])):
        where = f"{param}.functionDeclarations[{j}]"
        if not isinstance(decl, dict):
            raise invalid(f"Invalid value at '{where}': expected a FunctionDeclaration.", where)
        schema = field(decl, "parametersJsonSchema", dict, f"{where}.parametersJsonSchema")
        if schema is None:
            schema = field(decl, "parameters", dict, f"{where}.parameters", default={})
        specs.append(ToolSpec(
            name=field(decl, "name", str, f"{where}.name", required=True),
            description=field(decl, "description", str, f"{where}.description", default=""),
            parameters=schema,
        ))
    return specs


def _sampling(config: dict[str, Any]) -> SamplingRequest:
    where = "generationConfig"
    max_tokens = field(config, "maxOutputTokens", int, f"{where}.maxOutputTokens")
    if max_tokens is not None and max_tokens < 1:
        raise invalid(f"Invalid value at '{where}.maxOutputTokens': must be at least 1.",
                      f"{where}.maxOutputTokens")
    candidates = field(config, "candidateCount", int, f"{where}.candidateCount")
    if candidates not in (None, 1):
        raise invalid(f"Invalid value at '{where}.candidateCount': only 1 candidate is "
                      "supported.", f"{where}.candidateCount")
    stops = field(config, "stopSequences", list, f"{where}.stopSequences", default=[])
    if not all(isinstance(s, str) and s for s in stops):
        raise invalid(f"Invalid value at '{where}.stopSequences': expected non-empty strings.",
                      f"{where}.stopSequences")
    top_k = field(config, "topK", float, f"{where}.topK")  # the SDKs type it as a number
    seed = field(config, "seed", int, f"{where}.seed")
    return SamplingRequest(
        max_tokens=max_tokens,
        temperature=number_in(field(config, "temperature", float, f"{where}.temperature"),
                              0, 2, f"{where}.temperature"),
        top_p=number_in(field(config, "topP", float, f"{where}.topP"), 0, 1, f"{where}.topP")
        or None,
        top_k=None if top_k is None else max(0, int(top_k)),
        seed=seed,
        stop=tuple(stops),
    )


def _tool_choice(config: dict[str, Any], tool_names: list[str]) -> ToolChoice:
    """`toolConfig.functionCallingConfig`: AUTO, ANY (one allowed name: that function), NONE;
    VALIDATED is AUTO here (a call is parsed against the tool list either way)."""
    calling = field(config, "functionCallingConfig", dict, "toolConfig.functionCallingConfig",
                    default={})
    param = "toolConfig.functionCallingConfig.mode"
    mode = field(calling, "mode", str, param, default="AUTO")
    allowed = field(calling, "allowedFunctionNames", list,
                    "toolConfig.functionCallingConfig.allowedFunctionNames", default=[])
    if mode in ("AUTO", "MODE_UNSPECIFIED", "VALIDATED"):
        return AUTO
    if mode == "NONE":
        return ToolChoice("none")
    if mode == "ANY":
        if len(allowed) == 1 and isinstance(allowed[0], str):
            return ToolChoice("named", allowed[0]).check(tool_names, param)
        return ToolChoice("required").check(tool_names, param)
    raise invalid(f"Invalid value at '{param}': expected AUTO, ANY, NONE or VALIDATED, got "
                  f"{mode!r}.", param)


# --- response ----------------------------------------------------------------------------

_FINISH = {"stop": "STOP", "abort": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}


class GenerateWriter:
    """One answer as `GenerateContentResponse`s: one SSE chunk per event while streaming, the
    whole response otherwise (`body`); both are built from the same parts."""

    def __init__(self, model: str, prompt_tokens: int) -> None:
        self.id = secrets.token_urlsafe(16)
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.parts: list[dict[str, Any]] = []
        self._done: CallFinished | None = None

    def _usage(self) -> dict[str, int]:
        done = self._done
        out = done.completion_tokens if done is not None else 0
        return {"promptTokenCount": self.prompt_tokens, "candidatesTokenCount": out,
                "totalTokenCount": self.prompt_tokens + out}

    def _response(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if self._done is not None:
            candidate["finishReason"] = _FINISH[self._done.turn.finish_reason]
        return {"candidates": [candidate], "usageMetadata": self._usage(),
                "modelVersion": self.model, "responseId": self.id}

    @staticmethod
    def _chunk(data: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(data) + b"\r\n\r\n"

    def start(self) -> bytes:
        return b""

    def keepalive(self) -> bytes:
        return b""  # the Google SDKs stop at an SSE comment (see the module docstring)

    def feed(self, event: AnswerEvent) -> bytes:
        part = self._part(event)
        if part is None:
            if not isinstance(event, CallFinished):
                return b""
            self._done = event
            return self._chunk(self._response([]))
        self.parts.append(part)
        return self._chunk(self._response([part]))

    @staticmethod
    def _part(event: AnswerEvent) -> dict[str, Any] | None:
        if isinstance(event, TextDelta):
            return {"text": event.text} if event.text else None
        if isinstance(event, ReasoningDelta):
            return {"text": event.text, "thought": True} if event.text else None
        if isinstance(event, ReasoningDone):
            return ({"text": "", "thought": True, "thoughtSignature": event.signature}
                    if event.signature else None)
        if isinstance(event, ToolCallDone):
            call = event.call
            args = call.arguments if isinstance(call.arguments, dict) else {
                "arguments": call.arguments}  # kept, so the CLI sees (and can refuse) them
            return {"functionCall": {"id": call.id, "name": call.name, "args": args}}
        return None

    def body(self) -> dict[str, Any]:
        assert self._done is not None, "body() needs the call's CallFinished"
        return self._response(_merged(self.parts))

    def error_event(self, error: ProxyError) -> bytes:
        return self._chunk(error_body(error))  # the Python SDK raises on `data: {"error":`


def _merged(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text parts of one kind (the deltas of one text, or of one thought) as one, as a
    plain answer carries them."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if out and set(part) == set(out[-1]) and set(part) in ({"text"}, {"text", "thought"}):
            out[-1] = {**out[-1], "text": out[-1]["text"] + part["text"]}
        else:
            out.append(dict(part))
    return out or [{"text": ""}]


def count_body(tokens: int) -> dict[str, Any]:
    return {"totalTokens": tokens}


# --- errors ------------------------------------------------------------------------------

_ERRORS = {
    "invalid_request": (400, "INVALID_ARGUMENT"),
    "context_length": (400, "INVALID_ARGUMENT"),
    "authentication": (401, "UNAUTHENTICATED"),
    "forbidden": (403, "PERMISSION_DENIED"),
    "not_found": (404, "NOT_FOUND"),
    "too_large": (413, "INVALID_ARGUMENT"),
    "rate_limited": (429, "RESOURCE_EXHAUSTED"),
    "overloaded": (503, "UNAVAILABLE"),
    "internal": (500, "INTERNAL"),
}


def error_status(error: ProxyError) -> int:
    return _ERRORS[error.kind][0]


def error_body(error: ProxyError) -> dict[str, Any]:
    code, status = _ERRORS[error.kind]
    message = error.message
    if error.kind == "context_length":
        # Gemini's own wording for a prompt over the window (what its clients match).
        message = (f"The input token count ({error.prompt_tokens}) exceeds the maximum number "
                   f"of tokens allowed ({error.max_context}).")
    return {"error": {"code": code, "message": message, "status": status}}
