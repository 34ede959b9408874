"""Test-only: one conversation driven through each dialect's official SDK, the same way.

`DialectClient` hides what differs between the Anthropic Messages, OpenAI Chat and OpenAI
Responses SDKs (tool and `tool_choice` spelling, how an answer is read, how a CLI echoes it back
with its tool results), so a test can state a property once and run it in every dialect.
Echoes re-serialize tool arguments compactly and drop nothing, as the real CLIs do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai

SYSTEM = "You are a careful coding agent."


def tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}


@dataclass
class Answer:
    text: str
    calls: list[tuple[str, str, dict[str, Any]]]  # (id, name, arguments)
    raw: Any = None  # what the dialect's echo needs
    stop: str | None = None  # the dialect's stop/finish reason


@dataclass
class DialectClient:
    dialect: str  # "anthropic" | "chat" | "responses"
    client: Any
    tools: list[str] = field(default_factory=lambda: ["bash"])
    history: list[Any] = field(default_factory=list)

    @classmethod
    def open(cls, dialect: str, proxy: Any, session: Any, tools: list[str]) -> DialectClient:
        if dialect == "anthropic":
            client = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id,
                                         max_retries=0)
        else:
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
        return cls(dialect, client, tools)

    # --- wire spellings ---------------------------------------------------------------------

    def _tools(self) -> list[dict[str, Any]]:
        specs = [tool(n) for n in self.tools]
        if self.dialect == "anthropic":
            return [{"name": s["name"], "description": s["description"],
                     "input_schema": s["parameters"]} for s in specs]
        if self.dialect == "chat":
            return [{"type": "function", "function": s} for s in specs]
        return [{"type": "function", "strict": False, **s} for s in specs]

    def choice(self, mode: str, name: str | None = None, parallel: bool = True) -> dict:
        """`tool_choice` (and the parallel switch) as this dialect spells it."""
        if self.dialect == "anthropic":
            kind = {"required": "any", "named": "tool"}.get(mode, mode)
            out: dict[str, Any] = {"type": kind}
            if name:
                out["name"] = name
            if not parallel and mode != "none":
                out["disable_parallel_tool_use"] = True
            return {"tool_choice": out}
        if mode == "named":
            value: Any = ({"type": "function", "function": {"name": name}}
                          if self.dialect == "chat" else {"type": "function", "name": name})
        else:
            value = mode
        out = {"tool_choice": value}
        if not parallel:
            out["parallel_tool_calls"] = False
        return out

    # --- one call ---------------------------------------------------------------------------

    def ask(self, user: str | None = None, *, stream: bool = False, **kw: Any) -> Answer:
        if user is not None:
            self.history.append(self._user(user))
        answer = getattr(self, "_ask_" + self.dialect)(stream, **kw)
        return answer

    def _user(self, text: str) -> Any:
        if self.dialect == "responses":
            return {"type": "message", "role": "user", "content": text}
        return {"role": "user", "content": text}

    def _ask_anthropic(self, stream: bool, **kw: Any) -> Answer:
        kw = {"model": "policy", "max_tokens": 256, "system": SYSTEM, "messages": self.history,
              "tools": self._tools(), **kw}
        if stream:
            with self.client.messages.stream(**kw) as events:
                for _ in events:
                    pass
                message = events.get_final_message()
        else:
            message = self.client.messages.create(**kw)
        text = "".join(b.text for b in message.content if b.type == "text")
        calls = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
        return Answer(text, calls, message, message.stop_reason)

    def _ask_chat(self, stream: bool, **kw: Any) -> Answer:
        messages = [{"role": "system", "content": SYSTEM}, *self.history]
        kw = {"model": "policy", "messages": messages, "tools": self._tools(), **kw}
        if not stream:
            choice = self.client.chat.completions.create(**kw).choices[0]
            calls = [(c.id, c.function.name, json.loads(c.function.arguments))
                     for c in choice.message.tool_calls or []]
            return Answer(choice.message.content or "", calls, None, choice.finish_reason)
        text, calls, finish = [], [], None
        for chunk in self.client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            finish = chunk.choices[0].finish_reason or finish
            text.append(delta.content or "")
            for call in delta.tool_calls or []:
                calls.append((call.id, call.function.name, json.loads(call.function.arguments)))
        return Answer("".join(text), calls, None, finish)

    def _ask_responses(self, stream: bool, **kw: Any) -> Answer:
        kw = {"model": "policy", "input": self.history, "instructions": SYSTEM,
              "tools": self._tools(), "store": False, **kw}
        if stream:
            events = list(self.client.responses.create(stream=True, **kw))
            response = events[-1].response
        else:
            response = self.client.responses.create(**kw)
        output = [item.model_dump(exclude_none=True) for item in response.output]
        text = "".join(c["text"] for i in output if i["type"] == "message" for c in i["content"])
        calls = [(i["call_id"], i["name"], json.loads(i["arguments"])) for i in output
                 if i["type"] == "function_call"]
        return Answer(text, calls, output, response.status)

    # --- echo, as a CLI sends the turn back -------------------------------------------------

    def echo(self, answer: Answer, results: list[str]) -> None:
        """Append the assistant turn and one result per tool call (in order) to the history."""
        ids = [c[0] for c in answer.calls]
        if self.dialect == "anthropic":
            blocks = [b.model_dump(exclude_none=True) for b in answer.raw.content]
            self.history.append({"role": "assistant", "content": blocks})
            self.history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": i, "content": r}
                for i, r in zip(ids, results)]})
        elif self.dialect == "chat":
            turn: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
            if answer.calls:
                turn["tool_calls"] = [
                    {"id": i, "type": "function",
                     "function": {"name": n, "arguments": json.dumps(a, separators=(",", ":"))}}
                    for i, n, a in answer.calls]
            self.history.append(turn)
            self.history.extend({"role": "tool", "tool_call_id": i, "content": r}
                                for i, r in zip(ids, results))
        else:
            for item in answer.raw:
                if item["type"] == "message":
                    self.history.append({"type": "message", "role": "assistant", "content": [
                        {"type": "output_text", "text": c["text"]} for c in item["content"]]})
                else:
                    arguments = json.dumps(json.loads(item["arguments"]), separators=(",", ":"))
                    self.history.append({"type": "function_call", "call_id": item["call_id"],
                                         "name": item["name"], "arguments": arguments})
            self.history.extend({"type": "function_call_output", "call_id": i, "output": r}
                                for i, r in zip(ids, results))

