"""A Python project on disk as the miner sees it: its test targets, its source files, the test
command that runs them, and a content digest (the key of its cached test runs).

Layouts found: `tests/` or `test/` at the root or inside the package, `test_*.py` at the root,
`src/` (put on PYTHONPATH, after the grader's own directory). Compiled sources (`.c`, `.pyx`)
are refused: a mined task must build nowhere, its repository is the source tree itself.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..test_scope import find_test_directories, is_test_file

__all__ = ["IGNORED_DIRS", "Project", "ProjectError", "is_docs_path", "is_library_path",
           "scan_project", "tree_digest"]

IGNORED_DIRS = frozenset({".git", "__pycache__", ".tox", ".nox", ".venv", "venv", "build",
                          "dist", ".eggs", ".pytest_cache", ".mypy_cache", "node_modules"})
NOT_LIBRARY = frozenset({"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts",
                         "tools", "ci", ".github"})  # fmt: skip
NOT_LIBRARY_FILES = frozenset({"setup.py", "conftest.py", "noxfile.py", "fabfile.py"})
COMPILED = (".c", ".cc", ".cpp", ".pyx", ".rs")
DOC_SUFFIXES = (".rst", ".md", ".txt")
DOC_NAMES = frozenset({"LICENSE", "LICENCE", "COPYING", "CHANGES", "CHANGELOG", "HISTORY", "NEWS",
                       "AUTHORS", "MANIFEST", "CONTRIBUTING", "README"})  # fmt: skip


class ProjectError(ValueError):
    """The tree cannot be mined (no tests, no Python source, compiled code)."""


@dataclass(frozen=True)
class Project:
    root: Path
    name: str
    test_targets: list[str]  # what pytest is given, relative to the root
    sources: list[str]  # library modules that may be mutated, relative to the root
    src_layout: bool

    def test_cmd(self, python: str = "python") -> str:
        """The suite's command: `-rA` for the `pytest` log parser, no cache provider."""
        prefix = 'PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}src" ' if self.src_layout else ""
        targets = " ".join(shlex.quote(t) for t in self.test_targets)
        return f"{prefix}{shlex.quote(python)} -m pytest -rA -p no:cacheprovider {targets}"


def _files(root: Path) -> list[str]:
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not d.endswith(".egg-info"))
        rel = Path(folder).relative_to(root)
        found += [(rel / n).as_posix() for n in sorted(names)]
    return found


def is_library_path(path: str) -> bool:
    """A `.py` that is library code, not packaging, docs, examples or a conftest."""
    return (path.endswith(".py") and path.rsplit("/", 1)[-1] not in NOT_LIBRARY_FILES
            and path.split("/")[0] not in NOT_LIBRARY)  # fmt: skip


def is_docs_path(path: str) -> bool:
    """Documentation, examples, CI, licence and changelog: no part of what the tests exercise."""
    name = path.rsplit("/", 1)[-1]
    return (path.split("/")[0] in NOT_LIBRARY or name.endswith(DOC_SUFFIXES)
            or name.upper().split(".")[0] in DOC_NAMES)  # fmt: skip


def scan_project(root: Path, name: str | None = None) -> Project:
    root = Path(root)
    files = _files(root)
    if compiled := [f for f in files if f.endswith(COMPILED)]:
        raise ProjectError(f"{root}: holds compiled sources ({compiled[0]}): only pure-Python "
                           "projects can be mined")  # fmt: skip
    tests = [f for f in files
             if is_test_file(f.rsplit("/", 1)[-1]) and not f.endswith("conftest.py")]
    if not tests:
        raise ProjectError(f"{root}: no test files (test_*.py, *_test.py) found")
    directories = find_test_directories(tests)
    loose = [t for t in tests if not any(t.startswith(d + "/") for d in directories)
             and not t.split("/")[0] in NOT_LIBRARY]  # fmt: skip
    targets = sorted(directories) + sorted(loose)
    sources = [
        f for f in files
        if is_library_path(f) and f not in tests
        and not any(f.startswith(d + "/") for d in directories)
        and "/tests/" not in f"/{f}" and "/test/" not in f"/{f}"
    ]  # fmt: skip
    if not sources:
        raise ProjectError(f"{root}: no library source files besides the tests")
    return Project(root, name or root.name, targets, sources, (root / "src").is_dir())


def tree_digest(root: Path) -> str:
    """sha256 of every file's path and bytes (build litter skipped): a test run's cache key."""
    digest = hashlib.sha256()
    for rel in _files(root):
        if rel.endswith(".pyc"):
            continue
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()
