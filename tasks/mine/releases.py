"""A package's own history from the registry: one git commit per release, for `--git`.

Where a project's repository cannot be cloned (here only the package registries are reachable)
its releases still are: `release_history("inflection", ["0.3.1", "0.4.0", "0.5.0"], dest)`
makes `dest` a git repository whose commits are those sdists in order (their build metadata,
`PKG-INFO` and `*.egg-info`, left out). Each commit's message is `<name> <version>` and the
lines the release added to its changelog (CHANGES, CHANGELOG, HISTORY or NEWS), the authors'
own words for what changed. Real code, real tests, real changes: mining it with `--git` keeps
the releases whose new tests fail on the release before.
"""

from __future__ import annotations

import difflib
import shutil
from collections.abc import Sequence
from pathlib import Path

from .history import git
from .pypi import cached_sdist

__all__ = ["release_history"]

_CHANGELOGS = ("CHANGES", "CHANGELOG", "HISTORY", "NEWS")
_METADATA = ("PKG-INFO",)
_IDENTITY = ("-c", "user.name=release", "-c", "user.email=release@harness-gym.invalid")


def _changelog(root: Path) -> str:
    found = [p for p in sorted(root.iterdir())
             if p.is_file() and p.name.upper().split(".")[0] in _CHANGELOGS]  # fmt: skip
    return found[0].read_text(encoding="utf-8", errors="replace") if found else ""


def _added(before: str, after: str, limit: int = 40) -> str:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm="")
    lines = [line[1:] for line in list(diff)[2:] if line.startswith("+")]  # [2:]: the header
    return "\n".join(lines[:limit]).strip()


def release_history(name: str, versions: Sequence[str], dest: Path) -> Path:
    """Make `dest` (absent or empty) a git repository of `name`'s `versions`, oldest first."""
    if len(versions) < 2:
        raise ValueError("a history needs at least two releases")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    git(dest, "init", "-q", "-b", "main")
    previous_log = ""
    for version in versions:
        root = cached_sdist(f"{name}=={version}")
        for entry in dest.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        shutil.copytree(root, dest, dirs_exist_ok=True, symlinks=True,
                        ignore=shutil.ignore_patterns("*.egg-info", *_METADATA, "__pycache__",
                                                      "*.pyc"))  # fmt: skip
        log = _changelog(root)
        message = f"{name} {version}\n\n{_added(previous_log, log)}".strip() + "\n"
        previous_log = log
        git(dest, "add", "-A")
        git(dest, *_IDENTITY, "commit", "-q", "--allow-empty", "-m", message)
    return dest
