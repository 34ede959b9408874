"""OpenAI Responses: request -> canonical, the model's events -> response JSON or SSE events.

The proxy keeps no responses: a client must send its whole history in `input` (what Pi and
Codex do with `store: false`), so `previous_response_id` is refused with a clear 400.
A `function_call` item joins the assistant message just before it, and a `reasoning` item starts
the assistant turn after it, so an echoed turn (reasoning, message item, then its function
calls) is the one canonical assistant turn the bridge recognises. A thinking policy's reasoning
goes out as a `reasoning` item (`reasoning_text` content, our signature in `encrypted_content`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import replace
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
from .images import ImagePart, Part, from_data_url, parts_with_images, text_with_placeholders
from .openai_chat import error_body
from .tool_choice import ToolChoice, openai_tool_choice
from .wire import field, number_in

# --- request -----------------------------------------------------------------------------

_SYSTEM_ROLES = ("system", "developer")


def parse_responses_request(body: dict[str, Any]) -> ChatRequest:
    if body.get("previous_response_id") is not None:
        raise invalid("previous_response_id is not supported: this proxy stores no responses, "
                      "send the whole conversation in 'input' (store: false).",
                      "previous_response_id")
    messages: list[Message] = []
    instructions = field(body, "instructions", str, "instructions")
    if instructions:
        messages.append(Message("system", instructions))
    raw_input = field(body, "input", (str, list), "input", required=True)
    if isinstance(raw_input, str):
        messages.append(Message("user", raw_input))
    else:
        reasoning: list[ReasoningPart] = []  # waits for the assistant turn it belongs to
        for i, item in enumerate(raw_input):
            _add_item(messages, item, f"input[{i}]", reasoning)
    if not messages:
        raise invalid("'input' must contain at least one item.", "input")
    tools = tuple(
        spec
        for i, raw in enumerate(field(body, "tools", list, "tools", default=[]))
        if (spec := _parse_tool(raw, f"tools[{i}]")) is not None
    )
    max_tokens = field(body, "max_output_tokens", int, "max_output_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise invalid("Invalid 'max_output_tokens': must be at least 1.", "max_output_tokens")
    field(body, "metadata", dict, "metadata")
    sampling = SamplingRequest(
        max_tokens=max_tokens,
        temperature=number_in(field(body, "temperature", float, "temperature"), 0, 2, "temperature"),
        top_p=number_in(field(body, "top_p", float, "top_p"), 1e-9, 1, "top_p"),
    )
    return ChatRequest(
        messages=tuple(messages),
        tools=tools,
        sampling=sampling,
        stream=field(body, "stream", bool, "stream", default=False),
        model=field(body, "model", str, "model", default=""),
        tool_choice=openai_tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"),
                                       [t.name for t in tools]),
    )


def _add_item(
    messages: list[Message], item: Any, param: str, reasoning: list[ReasoningPart]
) -> None:
    if not isinstance(item, dict):
        raise invalid(f"Invalid type for '{param}': expected an object.", param)
    kind = field(item, "type", str, f"{param}.type", default="message")
    if kind == "reasoning":
        part = _reasoning_part(item, param)
        if part is not None:
            reasoning.append(part)
        return
    if kind in ("message", "function_call") and reasoning and (
        kind == "function_call" or item.get("role") == "assistant"
    ):
        # A reasoning item starts the assistant turn that follows it.
        messages.append(Message("assistant", reasoning=tuple(reasoning)))
    reasoning.clear()  # reasoning followed by anything else belongs to no turn
    if kind == "message":
        role = field(item, "role", str, f"{param}.role", required=True)
        if role in _SYSTEM_ROLES:
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise invalid(f"Invalid value for '{param}.role': '{role}'. Supported values are: "
                          "'user', 'assistant', 'system' and 'developer'.", f"{param}.role")
        parts = _content_parts(item.get("content"), f"{param}.content")
        text = text_with_placeholders(parts)
        images = parts_with_images(parts)
        last = messages[-1] if messages else None
        if (role == "assistant" and last is not None and last.role == "assistant"
                and last.reasoning and not last.content and not last.tool_calls):
            messages[-1] = replace(last, content=text, parts=images)  # its reasoning's turn
        else:
            messages.append(Message(role, text, parts=images))
    elif kind == "function_call":
        arguments = field(item, "arguments", str, f"{param}.arguments", required=True)
        try:
            parsed = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            parsed = arguments  # kept verbatim: the model may have written malformed JSON
        call = ToolCall(
            id=field(item, "call_id", str, f"{param}.call_id", required=True),
            name=field(item, "name", str, f"{param}.name", required=True),
            arguments=parsed,
        )
        if messages and messages[-1].role == "assistant":
            messages[-1] = replace(messages[-1], tool_calls=(*messages[-1].tool_calls, call))
        else:
            messages.append(Message("assistant", "", (call,)))
    elif kind == "function_call_output":
        output = item.get("output")
        parts = [output] if isinstance(output, str) else _content_parts(output, f"{param}.output")
        call_id = field(item, "call_id", str, f"{param}.call_id", required=True)
        messages.append(Message("tool", text_with_placeholders(parts), tool_call_id=call_id,
                                parts=parts_with_images(parts)))
    else:
        raise invalid(f"Unsupported input item type '{kind}' in '{param}': supported are "
                      "'message', 'function_call', 'function_call_output' and 'reasoning'.",
                      f"{param}.type")


def _reasoning_part(item: dict[str, Any], param: str) -> ReasoningPart | None:
    """The text of a reasoning item (its `reasoning_text` content, else its summary) and the
    signature we sent in `encrypted_content`; None for an empty item with no signature."""
    texts = []
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = field(item, key, list, f"{param}.{key}", default=[])
        texts = [p["text"] for p in parts if isinstance(p, dict) and p.get("type") == part_type
                 and isinstance(p.get("text"), str)]
        if texts:
            break
    signature = field(item, "encrypted_content", str, f"{param}.encrypted_content")
    if not texts and signature is None:
        return None
    return ReasoningPart("".join(texts), signature)


def _content_parts(raw: Any, param: str) -> list[Part]:
    """Text parts, and `input_image` / `input_file` parts (kept as images; see `images`)."""
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        raise invalid(f"Invalid type for '{param}': expected a string or an array of content "
                      "parts.", param)
    texts: list[Part] = []
    for i, part in enumerate(raw):
        where = f"{param}[{i}]"
        if not isinstance(part, dict):
            raise invalid(f"Invalid type for '{where}': expected an object.", where)
        kind = field(part, "type", str, f"{where}.type", required=True)
        if kind in ("input_image", "input_file"):
            texts.append(_file_part(part, kind, where))
            continue
        if kind not in ("input_text", "output_text", "text"):
            raise invalid(f"Unsupported content part type '{kind}' in '{where}': this model "
                          "takes text only.", f"{where}.type")
        texts.append(field(part, "text", str, f"{where}.text", required=True))
    return texts


def _file_part(part: dict[str, Any], kind: str, where: str) -> ImagePart:
    """`input_image` (`image_url`: a data or web URL, or a `file_id`) or `input_file`."""
    if kind == "input_image":
        url = field(part, "image_url", str, f"{where}.image_url")
        if url:
            return from_data_url(url)
        file_id = field(part, "file_id", str, f"{where}.file_id")
        if not file_id:
            raise invalid(f"Missing required parameter: '{where}.image_url' (or file_id).",
                          f"{where}.image_url")
        return ImagePart("", url="file:" + file_id)
    data = field(part, "file_data", str, f"{where}.file_data", default="")
    if data.startswith("data:"):
        return from_data_url(data, kind="document")
    if data:
        return ImagePart("", data, kind="document")
    url = field(part, "file_url", str, f"{where}.file_url", default="")
    return ImagePart("", url=url or "file:" + field(part, "file_id", str, f"{where}.file_id",
                                                     default=""), kind="document")

def _parse_tool(raw: Any, param: str) -> ToolSpec | None:
    """A function tool, or None for hosted tools (web search, file search...), which a local
    model cannot call."""
    if not isinstance(raw, dict):
        raise invalid(f"Invalid type for '{param}': expected an object.", param)
    kind = field(raw, "type", str, f"{param}.type", required=True)
    if kind != "function":
        return None
    return ToolSpec(
        name=field(raw, "name", str, f"{param}.name", required=True),
        description=field(raw, "description", str, f"{param}.description", default=""),
        parameters=field(raw, "parameters", dict, f"{param}.parameters", default={}),
    )


# --- response ----------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class ResponseWriter:
    """Turns one call's events into Responses output items: as SSE events while streaming
    (`start`, `feed`), and as the final response object (`response`). Both are built by the
    same code, so streamed and plain answers carry the same items."""

    def __init__(self, model: str, request: ChatRequest) -> None:
        self.id = _new_id("resp_")
        self.model = model
        self.created_at = int(time.time())
        self.sampling = request.sampling
        self.tool_choice = request.tool_choice
        self.tools = [
            {"type": "function", "name": t.name, "description": t.description,
             "parameters": t.parameters, "strict": False}
            for t in request.tools
        ]
        self.output: list[dict[str, Any]] = []
        self._text_open = False
        self._reasoning_open = False
        self._sequence = 0
        self._done: CallFinished | None = None

    def _event(self, kind: str, **data: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def response(self, status: str | None = None) -> dict[str, Any]:
        done = self._done
        if status is None:
            status = "in_progress" if done is None else (
                "incomplete" if done.turn.finish_reason == "length" else "completed")
        usage = None
        if done is not None:
            usage = {"input_tokens": done.prompt_tokens,
                     "input_tokens_details": {"cached_tokens": 0},
                     "output_tokens": done.completion_tokens,
                     "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": done.prompt_tokens + done.completion_tokens}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": None, "metadata": {}, "model": self.model,
            "output": self.output if done is not None else [],
            "parallel_tool_calls": self.tool_choice.parallel,
            "temperature": self.sampling.temperature, "top_p": self.sampling.top_p,
            "max_output_tokens": self.sampling.max_tokens,
            "tool_choice": _wire_tool_choice(self.tool_choice), "tools": self.tools,
            "usage": usage,
        }

    def body(self) -> dict[str, Any]:
        return self.response()

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"  # an SSE comment: the SDK skips it

    def error_event(self, error: ProxyError) -> bytes:
        return self.error_events(error)

    def start(self) -> bytes:
        head = self.response()
        return (self._event("response.created", response=head)
                + self._event("response.in_progress", response=head))

    def feed(self, event: AnswerEvent) -> bytes:
        if isinstance(event, (ReasoningDelta, ReasoningDone)):
            return self._reasoning(event)
        if isinstance(event, TextDelta):
            if not event.text:
                return b""
            out = b""
            if not self._text_open:
                item = {"id": _new_id("msg_"), "type": "message", "status": "in_progress",
                        "role": "assistant", "content": []}
                self.output.append(item)
                self._text_open = True
                out = self._event("response.output_item.added", output_index=self._index(),
                                  item=item) + self._event(
                    "response.content_part.added", item_id=item["id"],
                    output_index=self._index(), content_index=0, part=_text_part(""))
                item["content"].append(_text_part(""))
            item = self.output[-1]
            item["content"][0]["text"] += event.text
            return out + self._event("response.output_text.delta", item_id=item["id"],
                                     output_index=self._index(), content_index=0,
                                     delta=event.text, logprobs=[])
        if isinstance(event, ToolCallDone):
            out = self._close_text()
            call = event.call
            item = {"id": _new_id("fc_"), "type": "function_call", "status": "in_progress",
                    "call_id": call.id, "name": call.name, "arguments": ""}
            self.output.append(item)
            index = self._index()
            out += self._event("response.output_item.added", output_index=index, item=dict(item))
            item["arguments"] = call.arguments_json()
            item["status"] = "completed"
            return out + b"".join((
                self._event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=index, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", item_id=item["id"],
                            output_index=index, name=call.name, arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item),
            ))
        out = self._close_text()
        self._done = event
        final = self.response()
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=final)

    def _index(self) -> int:
        return len(self.output) - 1

    def _reasoning(self, event: ReasoningDelta | ReasoningDone) -> bytes:
        """A `reasoning` item: its text streams as `response.reasoning_text.delta`s; our
        signature of it goes in `encrypted_content` when it is done (it always comes first)."""
        if isinstance(event, ReasoningDone):
            if not self._reasoning_open:
                return b""
            self._reasoning_open = False
            item = self.output[-1]
            item.update(status="completed", encrypted_content=event.signature)
            part, index = item["content"][0], self._index()
            return b"".join((
                self._event("response.reasoning_text.done", item_id=item["id"],
                            output_index=index, content_index=0, text=part["text"]),
                self._event("response.content_part.done", item_id=item["id"],
                            output_index=index, content_index=0, part=part),
                self._event("response.output_item.done", output_index=index, item=item),
            ))
        if not event.text:
            return b""
        out = b""
        if not self._reasoning_open:
            item = {"id": _new_id("rs_"), "type": "reasoning", "status": "in_progress",
                    "summary": [], "content": []}
            self.output.append(item)
            self._reasoning_open = True
            out = self._event("response.output_item.added", output_index=self._index(),
                              item=dict(item, content=[])) + self._event(
                "response.content_part.added", item_id=item["id"], output_index=self._index(),
                content_index=0, part={"type": "reasoning_text", "text": ""})
            item["content"].append({"type": "reasoning_text", "text": ""})
        item = self.output[-1]
        item["content"][0]["text"] += event.text
        return out + self._event("response.reasoning_text.delta", item_id=item["id"],
                                 output_index=self._index(), content_index=0, delta=event.text)

    def _close_text(self) -> bytes:
        if not self._text_open:
            return b""
        self._text_open = False
        item = self.output[-1]
        item["status"] = "completed"
        part = item["content"][0]
        index = self._index()
        return b"".join((
            self._event("response.output_text.done", item_id=item["id"], output_index=index,
                        content_index=0, text=part["text"], logprobs=[]),
            self._event("response.content_part.done", item_id=item["id"], output_index=index,
                        content_index=0, part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ))

    def error_events(self, error: ProxyError) -> bytes:
        """A failure after the stream started: an `error` event, then `response.failed`."""
        body = error_body(error)["error"]
        failed = {**self.response("failed"),
                  "error": {"code": body["code"] or body["type"], "message": body["message"]}}
        return (self._event("error", code=body["code"], message=body["message"],
                            param=body["param"])
                + self._event("response.failed", response=failed))


def _wire_tool_choice(choice: ToolChoice) -> Any:
    if choice.mode == "named":
        return {"type": "function", "name": choice.name}
    return choice.mode


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
