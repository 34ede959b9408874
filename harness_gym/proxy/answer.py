"""From sampled token ids to the answer a client sees, one part per concern.

- `StopStrings`: the client's stop strings end the answer, also when one spans two deltas.
- `AnswerText`: token chunks -> text deltas (incremental detokenizing, cut at a stop string).
- `ParsedAnswer`: text deltas -> `ReasoningDelta` / `ReasoningDone` (`reasoning`), `TextDelta` /
  `ToolCallDone` events, and the `AssistantTurn`
  they add up to (the turn the trace records and the bridge later recognises).

Each is synchronous and testable alone; `model_call.PreparedCall.events` only wires them to the
engine's stream and the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engines.base import FinishReason, TokenChunk
from .canonical import AssistantTurn, ToolCall
from .detokenize import IncrementalDetokenizer
from .events import ParseEvent, TextDelta, ToolCallDone
from .reasoning import Piece, ThinkSplitter
from .tool_parsers import ToolCallParser


class StopStrings:
    """Cuts the answer before the first of `stops`. Once one is hit, `hit` names it and all
    later text is dropped."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.hit: str | None = None
        self._seen = ""

    def cut(self, text: str) -> str:
        if self.hit is not None:
            return ""
        if not self.stops or not text:
            return text
        start = len(self._seen)
        self._seen += text
        at = _first_stop(self._seen, self.stops, start)
        if at is None:
            return text
        self.hit = next(s for s in self.stops if self._seen.startswith(s, at))
        return text[: max(0, at - start)]


class AnswerText:
    """The answer's text as token chunks arrive: what each chunk adds, with the detokenizer's
    held-back bytes flushed on the last chunk and the text ended at a stop string."""

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = StopStrings(stops)

    def push(self, chunk: TokenChunk) -> str:
        text = self._detokenizer.push(chunk.token_ids)
        if chunk.finish_reason is not None:
            text += self._detokenizer.flush()
        return self._stops.cut(text)

    @property
    def stop_hit(self) -> str | None:
        return self._stops.hit


class ParsedAnswer:
    """Reasoning split off (where the policy thinks), tool-call parsing of the rest of the
    streamed text, and the turn the events add up to."""

    def __init__(
        self,
        parser: ToolCallParser,
        max_tool_calls: int | None = None,
        reasoning: ThinkSplitter | None = None,
    ) -> None:
        self._parser = parser
        self._reasoning = reasoning
        self._text: list[str] = []
        self._calls: list[ToolCall] = []
        self._max_calls = max_tool_calls

    @property
    def full(self) -> bool:
        """The answer holds as many tool calls as it may (`parallel_tool_calls: false`): the
        rest of it is not sent."""
        return bool(self._max_calls) and len(self._calls) >= self._max_calls

    def feed(self, text: str) -> list[ParseEvent]:
        if self._reasoning is None:
            return self._collect(self._parser.feed(text))
        return self._collect(self._parse(self._reasoning.feed(text)))

    def finish(self) -> list[ParseEvent]:
        events = [] if self._reasoning is None else self._parse(self._reasoning.finish())
        return self._collect(events + self._parser.finish())

    def _parse(self, pieces: list[Piece]) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        for piece in pieces:
            if isinstance(piece, str):
                events.extend(self._parser.feed(piece))
            else:
                events.append(piece)
        return events

    def turn(self, finish_reason: FinishReason) -> AssistantTurn:
        calls = tuple(self._calls)
        return AssistantTurn(
            content="".join(self._text),
            tool_calls=calls,
            finish_reason="tool_calls" if calls and finish_reason == "stop" else finish_reason,
            reasoning="" if self._reasoning is None else self._reasoning.text,
        )

    def _collect(self, events: list[ParseEvent]) -> list[ParseEvent]:
        kept: list[ParseEvent] = []
        for event in events:
            if self.full:
                break
            if isinstance(event, TextDelta):
                self._text.append(event.text)
            elif isinstance(event, ToolCallDone):
                self._calls.append(event.call)
            kept.append(event)
        return kept


def _first_stop(text: str, stops: tuple[str, ...], search_from: int) -> int | None:
    """Index in `text` where the earliest stop string starts, looking only at matches that end
    after `search_from` (earlier text was already checked)."""
    best = None
    for stop in stops:
        at = text.find(stop, max(0, search_from - len(stop) + 1))
        if at >= 0 and (best is None or at < best):
            best = at
    return best
