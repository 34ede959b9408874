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
line is not a module change), and neither does release metadata: the module's docstring and a
module-level assignment to dunder names but `__all__` (`__version__ = "1.22.2"`). Every release
of cachetools bumps its version, and parse's older releases their docstring's version history:
as code they put `<module>` into nearly every task, and a held-out `<module>` made every task
mixed. A file that does not parse is its `<module>` unit; a commit that changes nothing else
(comments, a version) is the `<module>` unit of each file it changes, so every task has one.
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

# first line (decorators included), last line, qualname (None: release metadata, no code)
Scope = tuple[int, int, str | None]


def unit(path: str, qualname: str) -> str:
    return f"{path}::{qualname}"


def scopes(source: str) -> list[Scope] | None:
    """Every def and class of `source` with its line span, outer before inner, and each
    module-level metadata assignment (named None); None when it does not parse."""
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

    metadata = [(node.lineno, node.end_lineno or node.lineno, None)
                for number, node in enumerate(tree.body) if _metadata(node, number)]  # fmt: skip
    return [*visit(tree, ""), *metadata]


def _metadata(node: ast.stmt, number: int) -> bool:
    """The module's docstring, or an assignment to dunder names but `__all__`."""
    if isinstance(node, ast.Expr):
        return number == 0 and isinstance(node.value, ast.Constant) and isinstance(
            node.value.value, str)
    if not isinstance(node, (ast.Assign, ast.AnnAssign)):
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = [t.id if isinstance(t, ast.Name) else "" for t in targets]
    return all(n.startswith("__") and n.endswith("__") and n != "__all__" for n in names)


def _scope_of(line: int, spans: list[Scope]) -> str | None:
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
    paths: list[str] = []
    for old_path, new_path, removed, added in _hunks(diff):
        path = new_path or old_path
        if path is None:
            continue
        paths.append(path)
        for text, lines in ((old.get(old_path or ""), removed), (new.get(new_path or ""), added)):
            if text is None or not lines:
                continue
            spans = scopes(text)
            source_lines = text.split("\n")  # as git and ast count: not at a form feed
            for number in lines:
                code = source_lines[number - 1].strip() if number <= len(source_lines) else ""
                if spans is not None and (not code or code.startswith("#")):
                    continue
                name = MODULE if spans is None else _scope_of(number, spans)
                if name is not None and unit(path, name) not in found:
                    found.append(unit(path, name))
    return found or list(dict.fromkeys(unit(path, MODULE) for path in paths))
