"""What the grader puts back before the tests run, and what it removes.

The agent may have edited any file. The grader restores the repository's *test scope* to the
task's base commit (then applies the task's test patch), so that the tests, their helpers and
the test configuration are the task's, whatever the agent did:

- test directories: every directory named `tests` or `test` with a test file somewhere below it
  in the base commit, and every `testing` directory with a test file directly in it (pytest's
  own layout). `django/test/` or `numpy/testing/`, library code that happens to carry the name,
  hold no test files and stay the agent's;
- test files anywhere (`test_*.py`, `*_test.py`), every `conftest.py`;
- pytest's configuration files (`pytest.ini`, `.pytest.ini`, `pytest.toml`, `.pytest.toml`,
  `pyproject.toml`, `tox.ini`, `setup.cfg`). The last three also hold the project's packaging
  and other tools' settings, which a fix may legitimately change (a console script entry in
  `[project.scripts]`): one the agent edited is restored only when what pytest (or tox) reads
  from it differs from the task's (`runner_config_section`, parsed, so a dotted TOML key or an
  inline table counts the same as a section header); `.gitignore` and `.gitattributes` (they
  steer the grader's own git commands);
- interpreter start-up hooks: `sitecustomize.*`, `usercustomize.*`, `*.pth`;
- every path the test patch touches.

Files of the scope that the agent added are removed; so are files the agent added that pytest
or Python would load before the tests: a module at the top of the tree (or of `src/`) named like
the runner (`pytest.py`, `_pytest/`, `pluggy/`) or like a standard library module (`python -m
pytest` puts the work dir first on sys.path, so an added `inspect.py` would run inside pytest
before the grader's plugin), and bytecode caches of tests and conftests
(`__pycache__` under test directories, pytest's `*-pytest-*.pyc` anywhere: a planted cache
with the source's size and mtime is loaded instead of the restored source).

Files in test directories that the agent added and git would ignore (build outputs such as an
in-place compiled test extension) stay: the sandbox removes untracked, unignored ones by asking
git after the `.gitignore` files are restored.
"""

from __future__ import annotations

import configparser
import fnmatch
import posixpath
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "BaseEntry",
    "RestorePlan",
    "in_test_scope",
    "plan_restore",
    "runner_config_section",
    "find_test_directories",
]

CONFIG_NAMES = frozenset(
    {
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "pyproject.toml",
        "tox.ini",
        "setup.cfg",
    }
)
SHARED_CONFIG_NAMES = frozenset({"pyproject.toml", "tox.ini", "setup.cfg"})  # not pytest's alone
GIT_STEERING_NAMES = frozenset({".gitignore", ".gitattributes"})
_STARTUP_PATTERNS = ("sitecustomize.*", "usercustomize.*", "*.pth")
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging"})
_SHADOWED = _RUNNER_MODULES | frozenset(sys.stdlib_module_names) - {"__future__"}
_CACHE_PATTERNS = ("conftest.*.pyc", "test_*.pyc", "*_test.*.pyc", "*-pytest-*.pyc")
_CACHE_PATTERNS += tuple(p + "c" for p in ("sitecustomize.*.py", "usercustomize.*.py"))


@dataclass(frozen=True)
class BaseEntry:
    """A file of the base commit: git mode ("100644", "100755", "120000", "160000") and blob."""

    mode: str
    blob: str

    @property
    def regular(self) -> bool:
        return self.mode in ("100644", "100755")


def is_test_file(name: str) -> bool:
    return name == "conftest.py" or (
        name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    )


def _named_in_scope(name: str) -> bool:
    return (
        is_test_file(name)
        or name in CONFIG_NAMES
        or name in GIT_STEERING_NAMES
        or any(fnmatch.fnmatchcase(name, p) for p in _STARTUP_PATTERNS)
    )


def find_test_directories(base_paths: Iterable[str]) -> frozenset[str]:
    """The topmost test directories of a tree (see the module doc), from its file paths."""
    found: set[str] = set()
    for path in base_paths:
        parts = path.split("/")
        if not is_test_file(parts[-1]) or parts[-1] == "conftest.py":
            continue
        for index, part in enumerate(parts[:-1]):
            if part in ("tests", "test"):
                found.add("/".join(parts[: index + 1]))
                break
        if len(parts) >= 2 and parts[-2] == "testing":
            found.add("/".join(parts[:-1]))
    return frozenset(d for d in found if not any(d.startswith(o + "/") for o in found))


def _under(path: str, directories: frozenset[str]) -> bool:
    return any(path == d or path.startswith(d + "/") for d in directories)


_UNREADABLE = object()


def runner_config_section(name: str, text: str) -> object:
    """What pytest (and tox) read from a shared configuration file, as comparable data; a
    sentinel that equals nothing when the file does not parse (it is then restored)."""
    try:
        if name == "pyproject.toml":
            return tomllib.loads(text).get("tool", {}).get("pytest")
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        parser.read_string(text)
    except (tomllib.TOMLDecodeError, configparser.Error, UnicodeError, AttributeError):
        return _UNREADABLE
    wanted = ("pytest", "tool:pytest") if name == "setup.cfg" else ("pytest", "tox", "testenv")
    return {
        section: dict(parser.items(section))
        for section in parser.sections()
        if section in wanted or section.startswith(("testenv:", "tox:"))
    }


def in_test_scope(path: str, directories: frozenset[str], touched: frozenset[str]) -> bool:
    return path in touched or _under(path, directories) or _named_in_scope(path.rsplit("/", 1)[-1])


def _top_level_module(path: str) -> tuple[str, str]:
    """(the path of the top-level entry `path` is or is in, its module name): the first path
    component, or the second under `src/`."""
    parts = path.split("/")
    depth = 2 if parts[0] == "src" and len(parts) > 1 else 1
    entry = "/".join(parts[:depth])
    name = parts[depth - 1]
    if depth == len(parts) and name.endswith((".py", ".pyc", ".so")):
        name = name.split(".", 1)[0]
    return entry, name


def _stale_cache(path: str, directories: frozenset[str]) -> bool:
    parent, _, name = path.rpartition("/")
    if posixpath.basename(parent) != "__pycache__":
        return False
    return _under(parent, directories) or any(fnmatch.fnmatchcase(name, p) for p in _CACHE_PATTERNS)


@dataclass
class RestorePlan:
    """What the sandbox does, in order: `remove` (rm -rf), restore `steering` (.gitignore,
    .gitattributes) from the base commit, remove untracked unignored files under `directories`,
    restore `restore`, then hash `verify` and compare with the base blob ids."""

    remove: list[str] = field(default_factory=list)
    steering: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    restore: list[str] = field(default_factory=list)
    verify: dict[str, str] = field(default_factory=dict)  # path -> expected blob id
    neutralised: list[str] = field(default_factory=list)  # added files pytest would have loaded


def plan_restore(
    base: Mapping[str, BaseEntry],
    disk: Mapping[str, str],
    touched: Iterable[str],
    keep: Iterable[str] = (),
) -> RestorePlan:
    """The plan for a work tree whose files are `disk` (path -> find's type letter: f, d, l, ...)
    against base commit `base` (path -> entry), when the test patch touches `touched`. Paths in
    `keep` (shared configuration files whose test sections are the task's) stay as they are."""
    kept = frozenset(keep) - frozenset(touched)
    touched_paths = frozenset(touched)
    directories = find_test_directories(base)
    base_dirs = {posixpath.dirname(p) for p in base}
    base_dirs |= {d for p in base_dirs for d in _ancestors(p)}
    plan = RestorePlan(directories=sorted(directories))
    remove: set[str] = set()

    for path, kind in disk.items():
        if path in base or (kind == "d" and path in base_dirs):
            continue
        name = path.rsplit("/", 1)[-1]
        entry, module = _top_level_module(path)
        shadows = module in _SHADOWED and entry not in base and entry not in base_dirs
        test_cache_dir = kind == "d" and name == "__pycache__" and _under(path, directories)
        if test_cache_dir or _stale_cache(path, directories):
            remove.add(path)
        elif _named_in_scope(name) or path in touched_paths or shadows:
            remove.add(path)
            if not path.endswith((".pyc", ".gitignore")):
                plan.neutralised.append(path + ("/" if kind == "d" else ""))

    for path, entry in base.items():
        if entry.mode == "160000" or not in_test_scope(path, directories, touched_paths):
            continue
        if path in kept and disk.get(path) == "f" and not _under(path, directories):
            continue
        for ancestor in _ancestors(posixpath.dirname(path)):
            if disk.get(ancestor, "d") != "d":  # a file or link where the base has a directory
                remove.add(ancestor)
        wanted = "f" if entry.regular else "l"
        if disk.get(path, wanted) != wanted:
            remove.add(path)
        target = plan.steering if path.rsplit("/", 1)[-1] in GIT_STEERING_NAMES else plan.restore
        target.append(path)
        if entry.regular and "\n" not in path:
            plan.verify[path] = entry.blob

    # Removing a directory removes what is under it: keep the topmost only.
    plan.remove = sorted(p for p in remove if not any(p.startswith(o + "/") for o in remove))
    plan.neutralised = sorted(
        p for p in plan.neutralised if not any(p.startswith(o + "/") and p != o + "/" for o in plan.remove)
    )
    plan.steering.sort()
    plan.restore.sort()
    return plan


def _ancestors(directory: str) -> list[str]:
    """`a/b/c` -> [`a`, `a/b`, `a/b/c`]; `` -> []."""
    if not directory:
        return []
    parts = directory.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
