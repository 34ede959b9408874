"""The Python code blocks of README.md and docs/*.md run as written.

Each ```python block is executed in a fresh interpreter in a temporary directory; a top-level
expression whose line ends in a comment holding a Python literal (`info["outcome"], reward
# ('passed', 0.99)`) must evaluate to it. A block that needs what a test machine lacks (a GPU, a
cluster, a cloud key, hours) is marked on the line before its fence with
`<!-- code-check: names REASON -->`: it is compiled, every name it imports must exist, and every
name it uses must be defined in it or be a builtin.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import io
import re
import subprocess
import sys
import symtable
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:^<!-- code-check: (?P<mode>\w+) (?P<reason>[^\n]*?) -->\n)?"
                   r"^```python\n(?P<code>.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    where: str
    code: str
    names_only: str | None  # the reason it is not executed


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("code")) + 1
            mode = match.group("mode")
            assert mode in (None, "names"), f"{path.name}:{line}: unknown code-check {mode!r}"
            found.append(Block(f"{path.name}:{line}", match.group("code"),
                               match.group("reason") if mode else None))
    return found


def undefined_names(code: str) -> set[str]:
    """Names a block reads that it never binds and that are not builtins."""
    top = symtable.symtable(code, "<block>", "exec")
    bound = {s.get_name() for s in top.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    known = bound | set(dir(builtins))
    missing: set[str] = set()

    def visit(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            # At the top every read counts; inside a lambda or comprehension, reads of globals.
            reads_global = symbol.is_referenced() and (table is top or symbol.is_global())
            if reads_global and symbol.get_name() not in known:
                missing.add(symbol.get_name())
        for child in table.get_children():
            visit(child)

    visit(top)
    return missing


def missing_imports(code: str) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                try:
                    importlib.import_module(alias.name)
                except ImportError as exc:
                    problems.append(f"import {alias.name}: {exc}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:
                problems.append(f"from {node.module}: {exc}")
                continue
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        problems.append(f"from {node.module} import {alias.name}: no such name")
    return problems


def with_checked_results(code: str) -> str:
    """The block with each `EXPR  # LITERAL` line turned into an assertion of that value."""
    comments = {tok.start[0]: tok.string[1:].strip()
                for tok in tokenize.generate_tokens(io.StringIO(code).readline)
                if tok.type == tokenize.COMMENT}
    lines = code.splitlines()
    for node in ast.parse(code).body:
        if not isinstance(node, ast.Expr) or node.lineno != node.end_lineno:
            continue
        comment = comments.get(node.lineno)
        try:
            expected = ast.literal_eval(comment) if comment else None
        except (ValueError, SyntaxError):
            continue
        if expected is None:
            continue
        expression = ast.get_source_segment(code, node)
        lines[node.lineno - 1] = (f"assert ({expression}) == {expected!r}, "
                                  f"({expression}, {expected!r})")
    return "\n".join(lines) + "\n"


BLOCKS = blocks()


def test_the_docs_have_code_blocks_and_the_checks_see_them():
    assert len(BLOCKS) >= 3
    assert undefined_names("import os\nx = os.sep + y\nf = lambda: z\n") == {"y", "z"}
    assert missing_imports("from harness_gym import NoSuchName\n") != []
    checked = with_checked_results("a = 1\na + 1  # 2\nprint(a)  # not a literal\n")
    assert "assert (a + 1) == 2" in checked and "print(a)" in checked


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_a_code_block_names_only_what_exists(block: Block):
    compile(block.code, block.where, "exec")
    assert missing_imports(block.code) == [], block.where
    assert undefined_names(block.code) == set(), block.where


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.names_only is None],
                         ids=lambda b: b.where)
def test_a_code_block_runs_as_written(block: Block, tmp_path: Path):
    run = subprocess.run([sys.executable, "-c", with_checked_results(block.code)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{block.where}:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
