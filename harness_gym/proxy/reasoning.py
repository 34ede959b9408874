"""Reasoning (`<think>…</think>`): split it from the answer as it streams, sign it, check echoes.

A policy whose chat template writes reasoning between `<think>` and `</think>` (Qwen3 and its
kin; detected from the template) gets its reasoning sent back in each dialect's own form:
Anthropic `thinking` blocks, Responses `reasoning` items, chat `reasoning_content`. The proxy
signs each turn's reasoning with an HMAC keyed per proxy and scoped to the session, and sends
the signature where the dialect has a place for one (Anthropic `signature`, Responses
`encrypted_content`), so an echoed block can be checked without trusting the client.

What the bridge does with an echoed turn of ours (`echo_status`, `PromptBridge._chain`):

- echoed unchanged (same text; a signature, where given, that verifies): the turn is ours, its
  sampled ids (reasoning included) are reused verbatim, whatever the template would render;
- not echoed at all (a CLI that keeps no reasoning; Qwen3's own template drops earlier
  reasoning too): still ours, ids reused the same way; counted as `missing` in the call's
  record;
- echoed altered (other text, a signature that does not verify, a redacted block): the history
  is not what the model produced, so no prompt extends through that turn: the call forks a new
  segment rendered from the history as sent (or branches from a turn of ours before it), and
  is counted as `altered` in the call's record; the same altered history sent again extends
  that new segment.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import orjson

from .canonical import Message
from .events import ReasoningDelta, ReasoningDone
from .tool_parsers import _partial_tag_suffix

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_SIGNATURE_PREFIX = "hgr1."


@dataclass(frozen=True)
class ReasoningFormat:
    """The policy thinks between `<think>` and `</think>`. `opened`: its generation prompt
    already ends with `<think>` (DeepSeek-R1, Qwen3-Thinking-2507), so the answer starts inside
    the reasoning."""

    opened: bool = False

    @classmethod
    def of(cls, render_text: Callable[..., str], chat_template: str) -> ReasoningFormat | None:
        """The format of a template (None: it does not think). `render_text` renders messages
        with the template (`PromptRenderer.render_text`)."""
        if THINK_CLOSE not in chat_template:
            return None
        prompt = render_text([{"role": "user", "content": "."}], add_generation_prompt=True)
        return cls(opened=prompt.rstrip().endswith(THINK_OPEN))


class ReasoningSigner:
    """MACs of reasoning text, keyed per proxy and scoped to one session, so a signature issued
    in one session never verifies in another."""

    def __init__(self, key: bytes, scope: str) -> None:
        if len(key) < 16:
            raise ValueError("a reasoning signing key needs at least 16 bytes")
        self._key = key
        self._scope = scope.encode()

    def sign(self, text: str) -> str:
        mac = hmac.new(self._key, self._scope + b"\0" + text.encode(), hashlib.sha256).digest()
        return _SIGNATURE_PREFIX + base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def verify(self, text: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(text).encode(), signature.encode())


class _Trimmed:
    """Streams text with its leading and trailing whitespace removed: trailing whitespace is
    held back until more text follows, so streamed and whole answers agree."""

    def __init__(self) -> None:
        self._started = False
        self._pending = ""

    def push(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        body = text.rstrip()
        if not body:
            self._pending += text
            return ""
        out = self._pending + body
        self._pending = text[len(body):]
        return out


Piece = ReasoningDelta | ReasoningDone | str  # a str is answer text, for the tool-call parser


class ThinkSplitter:
    """Splits the streamed answer into reasoning and answer text.

    Reasoning is what the model writes between a leading `<think>` and `</think>` (or from the
    start, when the prompt opened it); it streams as `ReasoningDelta`s and ends with one
    `ReasoningDone` holding the whole (trimmed) text and its signature, also when sampling
    stopped before `</think>`. Everything else is answer text, with the whitespace after
    `</think>` dropped. Text that does not start with `<think>` is all answer."""

    def __init__(self, fmt: ReasoningFormat, sign: Callable[[str], str]) -> None:
        self._sign = sign
        self._state = "reasoning" if fmt.opened else "start"
        self._buffer = ""
        self._trimmed = _Trimmed()
        self._reasoning: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self._reasoning)

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while self._buffer:
            if self._state == "start":
                head = self._buffer.lstrip()
                if head.startswith(THINK_OPEN):
                    self._buffer = head[len(THINK_OPEN):]
                    self._state = "reasoning"
                elif not head or THINK_OPEN.startswith(head):
                    break  # maybe the start of `<think>`: wait for more
                else:
                    self._state = "answer"
            elif self._state == "reasoning":
                end = self._buffer.find(THINK_CLOSE)
                if end < 0:
                    keep = _partial_tag_suffix(self._buffer, THINK_CLOSE)
                    self._think(self._buffer[: len(self._buffer) - keep], pieces)
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                self._think(self._buffer[:end], pieces)
                self._buffer = self._buffer[end + len(THINK_CLOSE):]
                pieces.append(self._done())
                self._state = "after"
            elif self._state == "after":
                self._buffer = self._buffer.lstrip()
                if self._buffer:
                    self._state = "answer"
            else:
                pieces.append(self._buffer)
                self._buffer = ""
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        rest, self._buffer = self._buffer, ""
        if self._state == "reasoning":  # sampling stopped inside the reasoning
            self._think(rest, pieces)
            pieces.append(self._done())
            self._state = "after"
        elif self._state in ("start", "answer") and rest:
            pieces.append(rest)
        return pieces

    def _think(self, text: str, pieces: list[Piece]) -> None:
        shown = self._trimmed.push(text)
        if shown:
            self._reasoning.append(shown)
            pieces.append(ReasoningDelta(shown))

    def _done(self) -> ReasoningDone:
        text = self.text
        return ReasoningDone(text, self._sign(text) if text else "")


# --- echoes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EchoReport:
    """How the turns of ours in one request echoed their reasoning."""

    missing: int = 0
    altered: int = 0


NO_ECHOES = EchoReport()
EchoStatus = Literal["intact", "missing", "altered"]


def echo_status(echoed: Message, sampled: Message, signer: ReasoningSigner) -> EchoStatus:
    """How `echoed` (a client's copy of a turn we sampled) carries that turn's reasoning:
    intact (the same text; every signature given verifies), missing (none echoed, or none
    sampled and none echoed) or altered."""
    ours = reasoning_text(sampled)
    if not echoed.reasoning:
        return "missing" if ours else "intact"
    if reasoning_text(echoed).strip() != ours.strip():
        return "altered"
    signed = all(part.signature is None or signer.verify(part.text, part.signature)
                 for part in echoed.reasoning)
    return "intact" if signed else "altered"


def echo_digest(message: Message) -> bytes:
    """What identifies an altered echo, so the same alteration sent again is the same history."""
    body = orjson.dumps([[part.text, part.signature] for part in message.reasoning])
    return hashlib.blake2b(body, digest_size=16).digest()


def reasoning_text(message: Message) -> str:
    return "".join(part.text for part in message.reasoning)


def without_reasoning(message: Message) -> Message:
    return replace(message, reasoning=()) if message.reasoning else message
