"""Which functions a commit changes: the split units of a history task.

`changed_units(diff, old, new)` reads a `git diff -U0` and both sides of each file and names
every scope a changed line sits in, as `path::qualname`: the innermost function or method
(`Cache.popitem`, a nested `outer.inner`), spelled as `mutate` names a mutant's function, so a
mined bug and a mined commit on the same method are one unit. A line of a class body outside
its methods (a class attribute, a base, a decorator of the class) is the class's unit
(`path::Cache`); a decorator belongs to what it decorates. Removed lines are placed in the old
file, added lines in the new one, so a deleted or a new function counts too.

A line outside every def and class (imports, constants, `__all__`, top-level statements) is
`path::<module>`, one unit per file: the file's own code that no function holds. Not the file
itself (`path`), which would mix two granularities in one draw (is `parse.py::f` part of a
held-out `parse.py`?), and not dropped either: a fix that changes a constant and a function
must keep the constant, or another task changing that constant could train on held-out code.
Blank and comment-only lines are no code and place nothing (a new function's separating blank
line is not a module change); a file whose changes are only those, or that does not parse, is
its `<module>` unit.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterator, Mapping

__all__ = ["MODULE", "changed_units", "scopes", "unit"]

MODULE = "<module>"

_FILE = re.compile(r"^(---|\+\+\+) (?:[ab]/)?(.*)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

Scope = tuple[int, int, str]  # first line (decorators included), last line, qualname


def unit(path: str, qualname: str) -> str:
    return f"{path}::{qualname}"


def scopes(source: str) -> list[Scope] | None:
    """Every def and class of `source` with its line span, outer before inner; None when it
    does not parse."""
    try:
        with warnings.catch_warnings():  # old code's `'\s'` warns on every parse
            warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None

    def visit(node: ast.AST, prefix: str) -> Iterator[Scope]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                name = f"{prefix}{child.name}"
                yield first, child.end_lineno or child.lineno, name
                yield from visit(child, f"{name}.")

    return list(visit(tree, ""))


def _scope_of(line: int, spans: list[Scope]) -> str:
    inside = [s for s in spans if s[0] <= line <= s[1]]
    return max(inside, key=lambda s: s[0])[2] if inside else MODULE


def _hunks(diff: str) -> Iterator[tuple[str | None, str | None, list[int], list[int]]]:
    """(old path, new path, removed line numbers, added line numbers) per file of a -U0 diff;
    a side that does not exist (an added or deleted file) is None."""
    old_path = new_path = None
    removed: list[int] = []
    added: list[int] = []
    started = False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            if started:
                yield old_path, new_path, removed, added
            old_path = new_path = None
            removed, added, started = [], [], True
            continue
        header = _FILE.match(line)
        if header and not removed and not added:
            path = None if header.group(2) == "/dev/null" else header.group(2)
            if header.group(1) == "---":
                old_path = path
            else:
                new_path = path
            continue
        hunk = _HUNK.match(line)
        if hunk:
            old_start, old_count, new_start, new_count = hunk.groups()
            old_n = 1 if old_count is None else int(old_count)
            new_n = 1 if new_count is None else int(new_count)
            removed += range(int(old_start), int(old_start) + old_n)
            added += range(int(new_start), int(new_start) + new_n)
    if started:
        yield old_path, new_path, removed, added


def changed_units(diff: str, old: Mapping[str, str | None],
                  new: Mapping[str, str | None]) -> list[str]:  # fmt: skip
    """The units (`path::qualname`, `path::<module>`) whose lines `diff` (a `git diff -U0`)
    changes; `old` and `new` give each path's text before and after (None: no such file)."""
    found: list[str] = []
    for old_path, new_path, removed, added in _hunks(diff):
        path = new_path or old_path
        if path is None:
            continue
        names: list[str] = []
        for text, lines in ((old.get(old_path or ""), removed), (new.get(new_path or ""), added)):
            if text is None or not lines:
                continue
            spans = scopes(text)
            source_lines = text.split("\n")  # as git and ast count: not at a form feed
            for number in lines:
                code = source_lines[number - 1].strip() if number <= len(source_lines) else ""
                if spans is None or not code or code.startswith("#"):
                    continue
                names.append(_scope_of(number, spans))
        for name in names or [MODULE]:
            if unit(path, name) not in found:
                found.append(unit(path, name))
    return found
