"""Procedural bugs in real functions, found with `ast` and written as minimal text edits.

`mutants(path, source)` lists every single-site change of these kinds inside a function body
(docstrings, decorators and f-string internals are left alone):

- `operator`: `+`<->`-`, `*`<->`/`, `//`->`/`, `%`->`//`, `**`->`*`, `&`<->`|`, `<<`<->`>>`;
- `comparison`: `<`<->`<=`, `>`<->`>=`, `==`<->`!=`, `in`<->`not in`, `is`<->`is not`;
- `boolean`: `and`<->`or`; `negation`: `not x` -> `x`;
- `off_by_one`: an int constant in a subscript, a slice or a `range()` call, plus or minus one;
- `constant`: another int constant plus one, `True`<->`False`;
- `return_none`: `return expr` -> `return None`;
- `drop_statement`: a call, assignment, augmented assignment or `raise` statement removed
  (`pass` where it was alone), `drop_branch`: an `if` without `else` removed, or the
  `else`/`elif` part of one;
- `swap_arguments`: the first two positional arguments of a call swapped.

Only the node's own text changes (an expression is re-printed with `ast.unparse` when it sits on
one line; statements are cut by whole lines), so the gold patch, the inverse diff, is a line
or two. A change that does not parse or that leaves the syntax tree as it was is dropped.
"""

from __future__ import annotations

import ast
import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["KINDS", "Mutant", "mutants"]

KINDS = ("operator", "comparison", "boolean", "negation", "off_by_one", "constant",
         "return_none", "drop_statement", "drop_branch", "swap_arguments")  # fmt: skip

_BINOPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div,
                             ast.Div: ast.Mult, ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv,
                             ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
                             ast.LShift: ast.RShift, ast.RShift: ast.LShift}  # fmt: skip
_CMPOPS: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                             ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn,
                             ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}  # fmt: skip
_DROPPABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise)


@dataclass(frozen=True)
class Mutant:
    path: str
    function: str  # qualified name of the function changed (`Class.method`)
    kind: str
    line: int  # first changed line, 1-based
    source: str  # the whole file with the bug
    original_line: str  # the line as it was (kept out of problem statements)


def mutants(path: str, source: str) -> list[Mutant]:
    """Every single-site mutant of `source` (see the module doc), in source order."""
    try:
        tree = _parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    original = ast.dump(tree)
    found: list[Mutant] = []
    seen: set[str] = set()
    for qualname, function in _functions(tree):
        for kind, line, edit in _edits(function, lines):
            mutated = edit()
            if mutated is None or mutated in seen:
                continue
            try:
                if ast.dump(_parse(mutated)) == original:
                    continue
            except SyntaxError:
                continue
            seen.add(mutated)
            found.append(Mutant(path, qualname, kind, line, mutated, lines[line - 1].strip()))
    return found


def _parse(source: str) -> ast.Module:
    # Quietly: old code's `'\s'` warns once per parse, and a package has thousands of mutants.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        return ast.parse(source)


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")

    yield from visit(tree, "")  # type: ignore[misc]


def _own_nodes(function: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, bool]]:
    """(node, parent, inside an index: a subscript, a slice or a `range()` call's arguments)
    in the function's body, not in nested functions, classes, f-strings or the docstring."""
    body = list(function.body)  # type: ignore[attr-defined]
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    stack = [(node, function, False) for node in reversed(body)]
    while stack:
        node, parent, in_index = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                             ast.JoinedStr)):  # fmt: skip
            continue
        yield node, parent, in_index
        inner = in_index or _indexes(node)
        stack += [(child, node, inner) for child in reversed(list(ast.iter_child_nodes(node)))]


Edit = Callable[[], str | None]


def _edits(function: ast.AST, lines: list[str]) -> Iterator[tuple[str, int, Edit]]:
    for node, parent, in_index in _own_nodes(function):
        at = getattr(node, "lineno", None)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            new = _with(node, op=_BINOPS[type(node.op)]())
            yield "operator", at, _expr(lines, node, new, parent)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
            new = _with(node, ops=[_CMPOPS[type(node.ops[0])]()])
            yield "comparison", at, _expr(lines, node, new, parent)
        elif isinstance(node, ast.BoolOp):
            new = _with(node, op=ast.Or() if isinstance(node.op, ast.And) else ast.And())
            yield "boolean", at, _expr(lines, node, new, parent)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield "negation", at, _expr(lines, node, node.operand, parent)
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            yield "constant", at, _expr(lines, node, ast.Constant(not node.value))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            if in_index:
                for step in (1, -1):
                    if node.value + step >= 0:
                        new = ast.Constant(node.value + step)
                        yield "off_by_one", at, _expr(lines, node, new)
            else:
                yield "constant", at, _expr(lines, node, ast.Constant(node.value + 1))
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                yield "return_none", at, _expr(lines, node.value, ast.Constant(None))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(
            isinstance(a, ast.Starred) for a in node.args[:2]
        ):
            yield "swap_arguments", at, _swap(lines, node.args[0], node.args[1])
        if isinstance(node, ast.stmt) and parent is not None:
            siblings = _block_of(parent, node)
            if isinstance(node, _DROPPABLE) and siblings is not None:
                yield "drop_statement", at, _drop(lines, node, siblings)
            elif isinstance(node, ast.If) and siblings is not None:
                if not node.orelse:
                    yield "drop_branch", at, _drop(lines, node, siblings)
                else:
                    yield "drop_branch", node.orelse[0].lineno, _drop_else(lines, node)


def _with(node: ast.AST, **changes: object) -> ast.AST:
    new = copy.deepcopy(node)
    for name, value in changes.items():
        setattr(new, name, value)
    return new


def _indexes(node: ast.AST) -> bool:
    if isinstance(node, (ast.Subscript, ast.Slice)):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "range")  # fmt: skip


def _block_of(parent: ast.AST, node: ast.stmt) -> list[ast.stmt] | None:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and any(s is node for s in block):
            return block
    return None


# --- text edits (ast offsets are UTF-8 byte columns) --------------------------------------------


def _splice(lines: list[str], spans: list[tuple[ast.AST, str]]) -> str | None:
    """Replace each node's text (all on one line each) by the given text, later spans first."""
    out = [line.encode() for line in lines]
    for node, text in sorted(spans, key=lambda s: (s[0].lineno, s[0].col_offset), reverse=True):
        if node.lineno != node.end_lineno:
            return None
        row = out[node.lineno - 1]
        out[node.lineno - 1] = row[: node.col_offset] + text.encode() + row[node.end_col_offset:]
    return b"".join(out).decode()


def _text(lines: list[str], node: ast.AST) -> str:
    return lines[node.lineno - 1].encode()[node.col_offset : node.end_col_offset].decode()


def _expr(lines: list[str], node: ast.AST, new: ast.AST, parent: ast.AST | None = None) -> Edit:
    def edit() -> str | None:
        text = ast.unparse(new)
        if isinstance(new, (ast.BinOp, ast.BoolOp, ast.Compare, ast.UnaryOp)) and not _loose(
            parent, new
        ):
            text = f"({text})"  # precedence stays the original's whatever surrounds it
        return _splice(lines, [(node, text)])

    return edit


def _loose(parent: ast.AST | None, new: ast.AST) -> bool:
    """Whether `new` needs no parentheses where it sits: a whole statement's expression, or a
    comparison or `not` directly under `and`/`or` (they bind tighter)."""
    if isinstance(parent, ast.stmt):
        return True
    return isinstance(parent, ast.BoolOp) and isinstance(new, (ast.Compare, ast.UnaryOp))


def _swap(lines: list[str], first: ast.AST, second: ast.AST) -> Edit:
    return lambda: _splice(lines, [(first, _text(lines, second)), (second, _text(lines, first))])


def _whole_lines(lines: list[str], node: ast.stmt) -> bool:
    """The statement alone on its lines (no `a; b`), so cutting the lines cuts only it."""
    head = lines[node.lineno - 1].encode()[: node.col_offset]
    tail = lines[node.end_lineno - 1].encode()[node.end_col_offset :]
    return not head.strip() and (not tail.strip() or tail.strip().startswith(b"#"))


def _cut(lines: list[str], first: int, last: int, indent: int, alone: bool) -> str:
    filler = [" " * indent + "pass\n"] if alone else []
    return "".join(lines[: first - 1] + filler + lines[last:])


def _drop(lines: list[str], node: ast.stmt, siblings: list[ast.stmt]) -> Edit:
    def edit() -> str | None:
        if not _whole_lines(lines, node):
            return None
        return _cut(lines, node.lineno, node.end_lineno, node.col_offset, len(siblings) == 1)

    return edit


def _drop_else(lines: list[str], node: ast.If) -> Edit:
    def edit() -> str | None:
        first = node.orelse[0]
        if isinstance(first, ast.If) and lines[first.lineno - 1].lstrip().startswith("elif"):
            start = first.lineno
        else:  # the `else:` line above the first statement of the else block
            start = next((n for n in range(first.lineno, node.lineno, -1)
                          if lines[n - 1].lstrip().startswith("else")), None)  # fmt: skip
            if start is None:
                return None
        tail = lines[node.end_lineno - 1].encode()[node.end_col_offset :]
        if tail.strip() and not tail.strip().startswith(b"#"):
            return None
        return _cut(lines, start, node.end_lineno, 0, False)

    return edit
