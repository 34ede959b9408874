"""Sub-agents: a conversation a tool call of the agent started, linked back to that call.

Claude Code's `Task`/`Agent` tool (OpenCode's `task`, Hermes' `delegate_task`) runs a second
conversation through the same session key: its own system prompt, its own tool set, and a first
user message that is the brief the parent wrote in the tool call's arguments. By tool set alone
those calls are `auxiliary` and unlinked; a trainer then cannot tell a sub-agent's work (which
earned part of the episode's reward) from title generation.

`SpawnRegistry` remembers, for every tool call the proxy answered, the long strings among its
arguments. A new segment whose tool set is not the agent's and whose opening user message
contains one of them is that call's sub-agent: its segment records `parent` (the segment holding
the call) and `parent_call_id` (the call's id as the proxy issued it: `call_...`; Anthropic
clients see it as `toolu_...` with the same suffix). The newest matching call wins, so a
sub-agent started twice with the same brief links to the later call.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .canonical import Message, ToolCall

MIN_BRIEF_CHARS = 16  # shorter argument strings ("ls", a path) would match by chance


@dataclass(frozen=True)
class Spawn:
    call_index: int  # the answering call, in `SessionTrace.calls` (its segment may move)
    call_id: str
    briefs: tuple[str, ...]


@dataclass(frozen=True)
class SubagentLink:
    call_index: int
    call_id: str


class SpawnRegistry:
    """The tool calls a later conversation may be the sub-agent of. Not thread-safe: the bridge
    calls it under its lock."""

    def __init__(self) -> None:
        self._spawns: list[Spawn] = []

    def add(self, call_index: int, calls: tuple[ToolCall, ...]) -> None:
        for call in calls:
            briefs = tuple({s.strip() for s in _strings(call.arguments)
                            if len(s.strip()) >= MIN_BRIEF_CHARS})
            if briefs:
                self._spawns.append(Spawn(call_index, call.id, briefs))

    def find(self, opening: str) -> SubagentLink | None:
        """The newest call whose brief the conversation's opening user message contains."""
        if not opening:
            return None
        for spawn in reversed(self._spawns):
            if any(brief in opening for brief in spawn.briefs):
                return SubagentLink(spawn.call_index, spawn.call_id)
        return None


def opening_text(messages: tuple[Message, ...]) -> str:
    """The first user message's text: where a sub-agent's brief arrives."""
    return next((m.content for m in messages if m.role == "user"), "")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
