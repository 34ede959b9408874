"""What one model call tells the dialect writing its answer, and the writer's contract.

A call (`model_call.PreparedCall.events`) yields `TextDelta` and `ToolCallDone` as the answer is
sampled and parsed (before them, for a policy that thinks, `ReasoningDelta`s and one
`ReasoningDone`), `KeepAlive` while nothing has been sampled yet (a long prefill), and ends
with one `CallFinished`. Each dialect turns these into its wire format through an
`AnswerWriter`; dialects depend on this module, never on the call machinery behind it.
`CallProgress` is what an observer of all calls (a progress display) is told.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .canonical import AssistantTurn, ToolCall
from .errors import ProxyError


@dataclass(frozen=True)
class TextDelta:
    """Answer text that can be shown now."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning text that can be shown now (see `reasoning`)."""

    text: str


@dataclass(frozen=True)
class ReasoningDone:
    """The reasoning is over: all of it (the deltas joined), and the proxy's signature of it
    ("" when there was none)."""

    text: str
    signature: str


@dataclass(frozen=True)
class ToolCallDone:
    """A complete tool call (tool calls are sent whole, once their closing tag is sampled)."""

    call: ToolCall


@dataclass(frozen=True)
class CallFinished:
    """The answer is over and recorded in the trace."""

    turn: AssistantTurn
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the client's stop string that ended the answer


@dataclass(frozen=True)
class KeepAlive:
    """Nothing sampled yet (long prefill): a streaming answer sends a ping."""


@dataclass(frozen=True)
class CallProgress:
    """Where one model call stands, for `ProxySettings.on_progress` (a live progress display).

    Reported when the call starts sampling (0 tokens), after each chunk, and once finished."""

    session_id: str
    prompt_tokens: int
    completion_tokens: int  # sampled so far
    finished: bool


ParseEvent = TextDelta | ToolCallDone | ReasoningDelta | ReasoningDone
AnswerEvent = ParseEvent | CallFinished
CallEvent = AnswerEvent | KeepAlive


class AnswerWriter(Protocol):
    """One answer in one dialect. Streaming: `start()`, then `feed()` per event (`keepalive()`
    for pings), `error_event()` if the call fails after the answer started. Not streaming:
    `feed()` every event, then `body()`. Both paths run the same `feed`, so a streamed answer
    and a plain one carry the same content."""

    def start(self) -> bytes: ...

    def feed(self, event: AnswerEvent) -> bytes: ...

    def keepalive(self) -> bytes: ...

    def error_event(self, error: ProxyError) -> bytes: ...

    def body(self) -> dict[str, Any]: ...
