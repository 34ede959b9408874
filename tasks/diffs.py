"""Reading git diffs: which paths a patch touches.

The grader resets every file a task's `test_patch` touches before applying it, so it must know
them exactly, including files the patch creates, deletes or renames, paths git quotes
(`"a/t\\303\\251st.py"`) and empty new files that have no `---`/`+++` lines at all.
"""

from __future__ import annotations

import codecs
import re

__all__ = ["paths_touched_by"]

_DIFF_HEADER = re.compile(r"^diff --git (?P<paths>.+)$")
_PATH_LINE = re.compile(
    r"^(?P<kind>--- |\+\+\+ |rename from |rename to |copy from |copy to )(?P<path>.+)$"
)


def _unquote(path: str) -> str:
    """Undo git's C-style quoting of unusual paths (`core.quotePath`)."""
    if len(path) >= 2 and path.startswith('"') and path.endswith('"'):
        raw = codecs.escape_decode(path[1:-1].encode("utf-8"))[0]
        return raw.decode("utf-8", errors="surrogateescape")
    return path


def _path_of(kind: str, text: str) -> str | None:
    """The repo-relative path on a `---`/`+++` line (`a/`, `b/` prefixed, maybe a tab and a
    timestamp after it) or a `rename`/`copy` line (no prefix)."""
    if kind in ("--- ", "+++ "):
        path = _unquote(text.split("\t", 1)[0].rstrip())
        if path == "/dev/null":
            return None
        return path[2:] if path.startswith(("a/", "b/")) else path
    return _unquote(text)


_QUOTED_HEADER = re.compile(r'^"a/((?:[^"\\]|\\.)*)" "b/((?:[^"\\]|\\.)*)"$')


def _header_paths(paths: str) -> list[str]:
    """The path on a `diff --git a/x b/x` line, for blocks without `---` lines (an empty new
    file, a mode change). Only same-path headers are read: both halves name one path, so the
    split is unambiguous even when the path holds spaces."""
    if quoted := _QUOTED_HEADER.match(paths):
        old, new = (_unquote(f'"{part}"') for part in quoted.groups())
        return [old] if old == new else []
    half = (len(paths) - 1) // 2
    old, new = paths[:half], paths[half + 1 :]
    if old.startswith("a/") and new.startswith("b/") and old[2:] == new[2:]:
        return [old[2:]]
    return []


def paths_touched_by(diff: str) -> list[str]:
    """Every path a git diff reads or writes, in first-seen order."""
    paths: dict[str, None] = {}  # an ordered set
    block_paths: list[str] = []
    header_paths: list[str] = []
    in_extended_header = False  # path lines only count before a block's first hunk

    def close_block() -> None:
        paths.update(dict.fromkeys(block_paths or header_paths))

    for line in diff.splitlines():
        if header := _DIFF_HEADER.match(line):
            close_block()
            block_paths, header_paths = [], _header_paths(header["paths"])
            in_extended_header = True
        elif line.startswith(("@@", "GIT binary patch")):
            in_extended_header = False
        elif in_extended_header and (path_line := _PATH_LINE.match(line)):
            path = _path_of(path_line["kind"], path_line["path"])
            block_paths += [path] if path is not None else []
    close_block()
    return list(paths)
