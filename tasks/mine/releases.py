"""A package's own history from the registry: one git commit per release, for `--git`.

Where a project's repository cannot be cloned (here only the package registries are reachable)
its releases still are: `release_history("inflection", ["0.3.1", "0.4.0", "0.5.0"], dest)`
makes `dest` a git repository whose commits are those sdists in order (their build metadata,
`PKG-INFO` and `*.egg-info`, left out). Each commit's message is `<name> <version>` and the
lines the release added to its changelog (CHANGES, CHANGELOG, HISTORY or NEWS), the authors'
own words for what changed. Real code, real tests, real changes: mining it with `--git` keeps
the releases whose new tests fail on the release before.

`registry_versions(name, since="7.0.0")` lists the final releases the registry holds, oldest
first, for a history of any package. An old release whose sdist pip cannot fetch (its
`setup.py` no longer runs on this Python) is left out with `skip_missing=True`: the next
release's commit then spans both, and its message says so.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .history import git
from .pypi import SdistError, cached_sdist

__all__ = ["registry_versions", "release_history"]

_CHANGELOGS = ("CHANGES", "CHANGELOG", "HISTORY", "NEWS")
_METADATA = ("PKG-INFO",)
_IDENTITY = ("-c", "user.name=release", "-c", "user.email=release@harness-gym.invalid")
# Fixed dates (one second apart, in order): the same releases make the same commits, so the
# task ids (`<label>__<sha>`) of a history made again hold, and a mining run resumes on it.
_EPOCH = 946684800  # 2000-01-01


def registry_versions(name: str, since: str | None = None, until: str | None = None) -> list[str]:
    """The final (not pre- or dev-) releases of `name` on the registry, oldest first, within
    `since` and `until` (both included), from `pip index versions`."""
    from packaging.version import InvalidVersion, Version

    command = [sys.executable, "-m", "pip", "index", "versions", name,
               "--disable-pip-version-check"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    listed = [line.split(":", 1)[1] for line in done.stdout.splitlines()
              if line.startswith("Available versions:")]  # fmt: skip
    if done.returncode != 0 or not listed:
        raise SdistError(f"the registry lists no release of {name}: "
                         f"{done.stderr.strip()[-500:]}")  # fmt: skip
    low, high = (Version(v) if v else None for v in (since, until))
    found: list[tuple[Version, str]] = []
    for text in (v.strip() for v in listed[0].split(",")):
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if version.is_prerelease or version.is_devrelease:
            continue
        if (low is None or version >= low) and (high is None or version <= high):
            found.append((version, text))
    return [text for _, text in sorted(found)]


def _changelog(root: Path) -> str:
    found = [p for p in sorted(root.iterdir())
             if p.is_file() and p.name.upper().split(".")[0] in _CHANGELOGS]  # fmt: skip
    return found[0].read_text(encoding="utf-8", errors="replace") if found else ""


def _added(before: str, after: str, limit: int = 40) -> str:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm="")
    lines = [line[1:] for line in list(diff)[2:] if line.startswith("+")]  # [2:]: the header
    return "\n".join(lines[:limit]).strip()


def release_history(name: str, versions: Sequence[str], dest: Path, *,
                    skip_missing: bool = False) -> Path:  # fmt: skip
    """Make `dest` (absent or empty) a git repository of `name`'s `versions`, oldest first.

    `skip_missing`: leave out a release whose sdist cannot be fetched instead of failing."""
    roots: list[tuple[str, Path, list[str]]] = []
    missing: list[str] = []
    for version in versions:
        try:
            roots.append((version, cached_sdist(f"{name}=={version}"), missing))
        except SdistError:
            if not skip_missing:
                raise
            missing = [*missing, version] if roots else []  # none before the first commit
            continue
        missing = []
    if len(roots) < 2:
        raise ValueError(f"a history needs at least two releases, {name} has {len(roots)} here")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    git(dest, "init", "-q", "-b", "main")
    previous_log = ""
    for index, (version, root, skipped) in enumerate(roots):
        for entry in dest.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        shutil.copytree(root, dest, dirs_exist_ok=True, symlinks=True,
                        ignore=shutil.ignore_patterns("*.egg-info", *_METADATA, "__pycache__",
                                                      "*.pyc"))  # fmt: skip
        log = _changelog(root)
        spans = f" (also {', '.join(skipped)}: no sdist pip can fetch)" if skipped else ""
        message = f"{name} {version}{spans}\n\n{_added(previous_log, log)}".strip() + "\n"
        previous_log = log
        git(dest, "add", "-A")
        date = f"@{_EPOCH + index} +0000"
        git(dest, *_IDENTITY, "commit", "-q", "--allow-empty", "-m", message,
            env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    return dest
