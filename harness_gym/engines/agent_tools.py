"""What tools a harness offers, read from the prompt, and how to call each for a scripted agent.

A scripted policy (the teacher) only sees the rendered prompt, where the chat template lists the
request's tools as one JSON object a line inside `<tools></tools>`. `AgentTools.from_prompt`
finds, by name and parameter schema rather than by harness, the three moves a coding agent
needs: read a file, replace exact text in a file, run a shell command. Pi's `read`/`edit`,
Claude Code's `Read`/`Edit`, OpenCode's `read`/`edit` differ only in parameter names
(`path`/`file_path`/`filePath`, `edits[].oldText`/`old_string`/`oldString`); where a harness
has no such tool, its shell does the job (`cat`, a Python one-liner that replaces the text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .text_edits import TextEdit

__all__ = ["AgentTools", "ToolCallText", "tool_call_text"]

_TOOLS_SECTION = re.compile(r"<tools>(.*?)</tools>", re.S)
SHELL_NAMES = ("bash", "terminal", "shell", "run_shell_command", "execute_command", "exec",
               "exec_command", "shell_command")
SHELL_PARAMS = ("command", "cmd")  # Codex's `exec_command` takes `cmd`
READ_NAMES = ("read", "read_file", "view", "cat")
WRITE_NAMES = ("write", "write_file", "create_file")
EDIT_NAMES = ("edit", "patch", "edit_file", "str_replace", "replace")
PATH_PARAMS = ("path", "file_path", "filePath", "filename")
EDIT_PAIRS = (("old_string", "new_string"), ("oldString", "newString"), ("oldText", "newText"),
              ("old_text", "new_text"), ("old_str", "new_str"))

ToolCallText = tuple[str, dict[str, Any]]  # (tool name, arguments)


def tool_call_text(call: ToolCallText) -> str:
    """The Hermes-style block the built-in chat templates render a tool call as."""
    name, arguments = call
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


@dataclass(frozen=True)
class AgentTools:
    shell: str | None = None
    shell_param: str = "command"  # the shell tool's command-string parameter
    read: tuple[str, str] | None = None  # (tool, path parameter)
    edit: tuple[str, str, str, str] | None = None  # (tool, path param, old param, new param)
    edit_list: str | None = None  # the array parameter holding {old, new} pairs (Pi: "edits")
    write: tuple[str, str, str] | None = None  # (tool, path param, content param)

    @classmethod
    def from_prompt(cls, prompt: str) -> AgentTools:
        return cls.from_specs(_tool_specs(prompt))

    @classmethod
    def from_specs(cls, specs: Sequence[dict[str, Any]]) -> AgentTools:
        """From tool specs as the template renders them (`{"function": {"name", "parameters"}}`
        or the bare function object). A tool counts for a move when its schema fits and its name
        is one of the move's usual names: Hermes has an edit-shaped `skill_manage` beside its
        `patch`, and a `command` parameter alone does not make a shell."""
        found: dict[str, Any] = {}
        for spec in specs:
            function = spec.get("function", spec)
            name = function.get("name")
            properties = (function.get("parameters") or {}).get("properties") or {}
            if not isinstance(name, str) or not isinstance(properties, dict):
                continue
            path = next((p for p in PATH_PARAMS if p in properties), None)
            lowered = name.lower()
            shell_param = next((p for p in SHELL_PARAMS if p in properties), None)
            if lowered in SHELL_NAMES and shell_param and "shell" not in found:
                found.update(shell=name, shell_param=shell_param)
            elif path and lowered in READ_NAMES:
                found.setdefault("read", (name, path))
            elif path and lowered in WRITE_NAMES and "content" in properties:
                found.setdefault("write", (name, path, "content"))
            elif path and lowered in EDIT_NAMES and (edit := _edit_shape(name, path, properties)):
                found.setdefault("edit", edit)
        edit, edit_list = found.pop("edit", (None, None))
        return cls(**found, edit=edit, edit_list=edit_list)

    # --- calls ----------------------------------------------------------------------------

    def read_call(self, path: str) -> ToolCallText:
        if self.read is not None:
            return self.read[0], {self.read[1]: path}
        return self._shell(f"cat {_quote(path)}")

    def edit_calls(self, path: str, edits: Sequence[TextEdit]) -> list[ToolCallText]:
        """One call where the tool takes a list of edits, else one call per edit."""
        if self.edit is None:
            return [self._shell(_python_replace(path, edits))]
        tool, path_param, old, new = self.edit
        if self.edit_list is not None:
            pairs = [{old: e.old, new: e.new} for e in edits]
            return [(tool, {path_param: path, self.edit_list: pairs})]
        return [(tool, {path_param: path, old: e.old, new: e.new}) for e in edits]

    def write_call(self, path: str, content: str) -> ToolCallText:
        if self.write is not None:
            tool, path_param, content_param = self.write
            return tool, {path_param: path, content_param: content}
        script = f"import pathlib\np = pathlib.Path({path!r})\np.parent.mkdir(parents=True, " \
                 f"exist_ok=True)\np.write_text({content!r})\n"
        return self._shell(_heredoc(script))

    def shell_call(self, command: str) -> ToolCallText:
        return self._shell(command)

    def _shell(self, command: str) -> ToolCallText:
        if self.shell is None:
            raise LookupError("the harness offers no shell tool (and no tool for this move)")
        return self.shell, {self.shell_param: command}


def _tool_specs(prompt: str) -> list[dict[str, Any]]:
    specs = []
    for section in _TOOLS_SECTION.findall(prompt):
        for line in section.splitlines():
            try:
                spec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(spec, dict):
                specs.append(spec)
    return specs


def _edit_shape(
    name: str, path: str, properties: dict[str, Any]
) -> tuple[tuple[str, str, str, str], str | None] | None:
    for old, new in EDIT_PAIRS:
        if old in properties and new in properties:
            return (name, path, old, new), None
    for param, schema in properties.items():  # Pi: edits: [{oldText, newText}]
        items = schema.get("items") if isinstance(schema, dict) else None
        inner = (items or {}).get("properties") if isinstance(items, dict) else None
        if isinstance(inner, dict):
            for old, new in EDIT_PAIRS:
                if old in inner and new in inner:
                    return (name, path, old, new), param
    return None


def _quote(path: str) -> str:
    return path if re.fullmatch(r"[\w./-]+", path) else "'" + path.replace("'", "'\\''") + "'"


def _heredoc(script: str) -> str:
    return f"python3 - <<'HARNESS_GYM_EDIT'\n{script}HARNESS_GYM_EDIT"


def _python_replace(path: str, edits: Sequence[TextEdit]) -> str:
    lines = ["import pathlib", f"p = pathlib.Path({path!r})", "s = p.read_text()"]
    lines += [f"s = s.replace({e.old!r}, {e.new!r}, 1)" for e in edits]
    lines.append("p.write_text(s)")
    return _heredoc("\n".join(lines) + "\n")
