"""The canonical conversation every dialect translates into and out of.

A request from any CLI (OpenAI Chat, Anthropic Messages, OpenAI Responses) becomes a
`ChatRequest` of `Message`s and `ToolSpec`s; the bridge, the prompt renderer, the tool-call
parser and the trace only ever see these types.

`Message.semantic_key()` is what the bridge compares: the CLIs do not echo the model's turn
byte for byte (they re-serialize tool arguments, send `content: ""` or `null` for an empty
turn, and Claude Code sends parsed `input` objects), so two messages are "the same turn" when
their roles, normalised text and tool calls (names and arguments as parsed JSON, numbers as the
JavaScript CLIs round-trip them: `json_echo`) are equal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from .images import Part, template_content
from .json_echo import echo_key
from .tool_choice import AUTO, ToolChoice

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made. `arguments` is parsed JSON where it parses, else the raw
    string (kept verbatim so a malformed call still round-trips)."""

    id: str
    name: str
    arguments: Any

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(self.arguments).decode()


@dataclass(frozen=True)
class ReasoningPart:
    """Reasoning an assistant turn carries: sampled by us, or echoed by a client with the
    signature we issued (None where the dialect has no place for one: chat)."""

    text: str
    signature: str | None = None


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    # Set when the content held images: text and `ImagePart`s in order; `content` is then the
    # text with a placeholder per image (what a text-only model reads; see `images`).
    parts: tuple[Part, ...] = field(default=(), compare=False)
    # Not part of `semantic_key`: a turn echoed without its reasoning is still that turn
    # (`reasoning.check_echoes` decides what an altered one means).
    reasoning: tuple[ReasoningPart, ...] = ()

    def template_dict(self, multimodal: bool = False) -> dict[str, Any]:
        """The message as Hugging Face chat templates expect it (OpenAI shape, arguments as
        mappings so templates can `tojson` them); with `multimodal`, content holding images is a
        list of text and image parts."""
        content: Any = template_content(self.parts) if multimodal and self.parts else self.content
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning:  # the field Qwen3-style templates read
            out["reasoning_content"] = "".join(part.text for part in self.reasoning)
        return out

    def semantic_key(self) -> bytes:
        """16 bytes that are equal for two renderings of the same turn (see module docstring).
        Computed once per message: a session's parsed messages are reused (`message_cache`)."""
        key = self.__dict__.get("_semantic_key")
        if key is None:
            key = self._compute_semantic_key()
            object.__setattr__(self, "_semantic_key", key)  # frozen: memoised, not a field
        return key

    def _compute_semantic_key(self) -> bytes:
        if self.role == "assistant":
            # Tool call ids are ours to issue and some CLIs rewrite them; text is compared
            # after trimming because empty turns come back as "", None or whitespace.
            body: list[Any] = [
                "assistant",
                self.content.strip(),
                [[call.name, echo_key(call.arguments).hex()] for call in self.tool_calls],
            ]
        else:
            body = [self.role, self.content, self.tool_call_id, self.name]
        return hashlib.blake2b(
            orjson.dumps(body, option=orjson.OPT_SORT_KEYS), digest_size=16
        ).digest()


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    def template_dict(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class SamplingRequest:
    """Sampling fields the client asked for; None means "not given"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    sampling: SamplingRequest = SamplingRequest()
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    tool_choice: ToolChoice = AUTO

    def tools_key(self) -> bytes:
        """Digest of the tool list: a different tool set is a different conversation."""
        body = [[t.name, t.description, t.parameters] for t in self.tools]
        return hashlib.blake2b(
            orjson.dumps(body, option=orjson.OPT_SORT_KEYS), digest_size=16
        ).digest()


@dataclass(frozen=True)
class AssistantTurn:
    """What the model produced in one call, parsed: the answer a dialect sends back."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: Literal["stop", "length", "tool_calls", "abort"]
    reasoning: str = ""  # what the model wrote between <think> and </think>

    def as_message(self) -> Message:
        return Message(role="assistant", content=self.content, tool_calls=self.tool_calls,
                       reasoning=(ReasoningPart(self.reasoning),) if self.reasoning else ())
