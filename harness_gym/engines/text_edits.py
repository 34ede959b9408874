"""From a unified diff to the edits an agent would make with an exact-text edit tool.

An agent with `edit(path, oldText, newText)` (Pi, Claude Code, OpenCode...) changes a file by
naming text it has read. `FilePatch.edits(text)` turns each hunk of a gold patch into such an
edit against `text`, the file as the agent saw it: the changed lines only, widened with the
hunk's context lines just until `oldText` is unique in `text` (the tools refuse ambiguous
matches). An edit whose text is not in `text` raises `EditNotGrounded`: a demonstration must
never name text its agent did not read.

The hunk reader is a few lines on purpose: only `@@` hunks of modified and new files are needed,
and a dependency for that would be heavier than the code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["EditNotGrounded", "FilePatch", "TextEdit", "parse_patch"]

_HEADER = re.compile(r"^diff --git a/(?P<old>\S+) b/(?P<new>\S+)$")


class EditNotGrounded(ValueError):
    """The text a hunk replaces is not (or not uniquely) in the file the agent read."""


@dataclass(frozen=True)
class TextEdit:
    old: str
    new: str


@dataclass
class Hunk:
    lines: list[str] = field(default_factory=list)  # each with its ' ', '-' or '+' marker

    def side(self, keep: str) -> list[str]:
        return [line[1:] for line in self.lines if line[:1] in (" ", keep)]


@dataclass
class FilePatch:
    path: str
    new_file: bool = False
    deleted: bool = False
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def new_content(self) -> str:
        """A new file's whole text."""
        return "".join(line + "\n" for hunk in self.hunks for line in hunk.side("+"))

    def udiff(self) -> str:
        """The file's hunks as one ```diff block in aider's udiff edit format, with its `@@ ... @@`
        hunk headers: aider ignores line numbers, and an agent could not know them."""
        lines = [f"--- {'/dev/null' if self.new_file else 'a/' + self.path}", f"+++ b/{self.path}"]
        for hunk in self.hunks:
            lines += ["@@ ... @@", *hunk.lines]
        return "```diff\n" + "\n".join(lines) + "\n```\n"

    def edits(self, text: str) -> list[TextEdit]:
        """One edit per hunk, grounded in `text` (see the module docstring)."""
        return [_edit(hunk, text, self.path) for hunk in self.hunks]


def parse_patch(patch: str) -> list[FilePatch]:
    """The files of a `git diff`, in order, with their hunks."""
    files: list[FilePatch] = []
    hunk: Hunk | None = None
    for line in patch.splitlines():
        if match := _HEADER.match(line):
            files.append(FilePatch(match["new"]))
            hunk = None
        elif not files:
            continue
        elif line.startswith("new file mode"):
            files[-1].new_file = True
        elif line.startswith("deleted file mode"):
            files[-1].deleted = True
        elif line.startswith("@@"):
            hunk = Hunk()
            files[-1].hunks.append(hunk)
        elif hunk is not None and line[:1] in (" ", "-", "+"):
            hunk.lines.append(line)
        elif hunk is not None and line == "":  # a blank context line whose space was stripped
            hunk.lines.append(" ")
    return files


def _edit(hunk: Hunk, text: str, path: str) -> TextEdit:
    old, new = hunk.side("-"), hunk.side("+")
    start = 0  # leading context shared by both sides
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0  # trailing context shared by both sides, not overlapping the leading part
    while end < min(len(old), len(new)) - start and old[-1 - end] == new[-1 - end]:
        end += 1
    lo, hi = start, len(old) - end  # old[lo:hi] is what changes
    if lo == hi:  # a pure insertion: anchor it on a neighbouring context line
        lo, hi = (lo - 1, hi) if lo > 0 else (lo, hi + 1)
    grow_up = True  # widen by one context line at a time, above and below in turn
    while True:
        before, after = _block(old[lo:hi]), _block(new[lo : len(new) - (len(old) - hi)])
        if not after and before:  # deleting whole lines deletes their newlines too
            before += "\n"
        found = text.count(before)
        if found == 1:
            return TextEdit(before, after)
        if found == 0:
            raise EditNotGrounded(f"{path}: the text to replace is not in what was read: "
                                  f"{before!r}")
        if lo == 0 and hi == len(old):
            raise EditNotGrounded(f"{path}: {before!r} occurs {found} times, even with context")
        if lo > 0 and (grow_up or hi == len(old)):
            lo -= 1
        else:
            hi += 1
        grow_up = not grow_up


def _block(lines: list[str]) -> str:
    return "\n".join(lines)
