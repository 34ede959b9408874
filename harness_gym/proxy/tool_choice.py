"""`tool_choice` and parallel tool calls: what the client allows, and how the answer obeys it.

Every dialect parses its own spelling into one `ToolChoice` (Anthropic `auto`/`any`/`tool`/
`none` and `disable_parallel_tool_use`; OpenAI Chat and Responses `auto`/`required`/`none`/a
named function and `parallel_tool_calls`). `steer` turns it into what the call does:

- `none`: the tools stay in the prompt (the conversation, and so the bridged segment, is the
  same one the agent is in) but the tool-call open tag is a hidden stop string: the answer ends
  where the model would start a call, so it carries text only.
- `required` / named: the answer is made to start with the tool-call prefix (`<tool_call>\\n`,
  and for a named tool also `{"name": "NAME", "arguments": `; after `</think>` where the
  generation prompt opened the policy's reasoning). Those tokens are appended to the
  prompt the engine sees and recorded in the trace as *forced* response tokens: `loss_mask` 0
  and logprob 0.0 (like inserted tool results), counted per call in `forced_tokens`. They are
  masked out of the loss because the policy did not sample them: they have no p_old, and
  training on them would teach the model to copy what the proxy wrote. The sampled remainder
  is the model's own (mask 1). A model that then writes a malformed call body gets its text
  back as text, as the model wrote it: the proxy steers, it never invents arguments.
- `parallel=False`: generation ends once the first tool call is complete; later text is not
  sent (the tokens that were sampled stay in the trace, faithful to the engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import orjson

from .errors import invalid

ToolChoiceMode = Literal["auto", "none", "required", "named"]


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    name: str | None = None  # the tool for mode "named"
    parallel: bool = True  # several tool calls in one answer are allowed

    def check(self, tool_names: list[str], param: str) -> ToolChoice:
        """This choice, refused with a 400 when it asks for a tool the request does not offer."""
        if self.mode in ("required", "named") and not tool_names:
            raise invalid(f"{param}: a tool call is required but the request offers no tools.",
                          param)
        if self.mode == "named" and self.name not in tool_names:
            raise invalid(f"{param}: tool {self.name!r} is not among the request's tools "
                          f"({', '.join(tool_names)}).", param)
        return self


AUTO = ToolChoice()


def anthropic_tool_choice(raw: object, tool_names: list[str]) -> ToolChoice:
    """Anthropic: `{"type": "auto" | "any" | "tool" | "none", "name": ...,
    "disable_parallel_tool_use": bool}`."""
    if raw is None:
        return AUTO
    if not isinstance(raw, dict):
        raise invalid("tool_choice: expected an object", "tool_choice")
    kind = raw.get("type")
    parallel = raw.get("disable_parallel_tool_use") is not True
    if kind == "auto":
        return ToolChoice("auto", parallel=parallel)
    if kind == "none":
        return ToolChoice("none")
    if kind == "any":
        return ToolChoice("required", parallel=parallel).check(tool_names, "tool_choice")
    if kind == "tool":
        name = raw.get("name")
        if not isinstance(name, str):
            raise invalid("tool_choice.name: a tool name is required for type 'tool'",
                          "tool_choice.name")
        return ToolChoice("named", name, parallel).check(tool_names, "tool_choice")
    raise invalid(f"tool_choice.type: expected 'auto', 'any', 'tool' or 'none', got {kind!r}",
                  "tool_choice.type")


def openai_tool_choice(raw: object, parallel: object, tool_names: list[str]) -> ToolChoice:
    """OpenAI Chat (`{"type": "function", "function": {"name": ...}}`) and Responses
    (`{"type": "function", "name": ...}`), or `"auto"`, `"required"`, `"none"`; plus
    `parallel_tool_calls`."""
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("Invalid type for 'parallel_tool_calls': expected a boolean.",
                      "parallel_tool_calls")
    allow_parallel = parallel is not False
    if raw is None or raw == "auto":
        return ToolChoice("auto", parallel=allow_parallel)
    if raw == "none":
        return ToolChoice("none")
    if raw == "required":
        return ToolChoice("required", parallel=allow_parallel).check(tool_names, "tool_choice")
    if isinstance(raw, dict) and raw.get("type") == "function":
        function = raw.get("function")
        name = function.get("name") if isinstance(function, dict) else raw.get("name")
        if isinstance(name, str):
            return ToolChoice("named", name, allow_parallel).check(tool_names, "tool_choice")
    raise invalid("Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
                  "{\"type\": \"function\", ...} naming a function.", "tool_choice")


@dataclass(frozen=True)
class Steering:
    """What a call does to obey its `ToolChoice` (see the module docstring)."""

    forced_text: str = ""  # the answer's first characters, written by the proxy
    hidden_stops: tuple[str, ...] = ()  # stop strings the client did not ask for
    max_tool_calls: int | None = None  # None: any number


NO_STEERING = Steering()


def steer(choice: ToolChoice, open_tag: str) -> Steering:
    """The steering for `choice` under a tool-call format whose calls open with `open_tag`
    followed by a Hermes-style JSON body (`{"name": ..., "arguments": ...}`)."""
    limit = None if choice.parallel else 1
    if choice.mode == "none":
        return Steering(hidden_stops=(open_tag,), max_tool_calls=0)
    if choice.mode == "required":
        return Steering(open_tag + "\n", max_tool_calls=limit)
    if choice.mode == "named":
        assert choice.name is not None
        name = orjson.dumps(choice.name).decode()
        return Steering(f'{open_tag}\n{{"name": {name}, "arguments": ', max_tool_calls=limit)
    return Steering(max_tool_calls=limit)
