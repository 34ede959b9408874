"""The hash git would give a directory's one-commit repository, computed without running git.

Loading a suite needs every directory task's `base_commit`; making a scratch repository per task
for that took ~170 ms each (git init, add, commit). Hashing the objects here takes a few ms. The
result must equal what `materialize` gets from real git: tests check both on every built-in task.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CommitIdentity", "commit_hash", "tree_entries"]


@dataclass(frozen=True)
class CommitIdentity:
    """Who made the commit, when (UTC), and its message; fixed, the hash depends on files only."""

    name: str
    email: str
    epoch_s: int
    message: str

    def git_env(self) -> dict[str, str]:
        """The environment that makes `git commit` use this identity."""
        when = f"{self.epoch_s} +0000"  # git's internal date format
        return {
            "GIT_AUTHOR_NAME": self.name,
            "GIT_AUTHOR_EMAIL": self.email,
            "GIT_AUTHOR_DATE": when,
            "GIT_COMMITTER_NAME": self.name,
            "GIT_COMMITTER_EMAIL": self.email,
            "GIT_COMMITTER_DATE": when,
        }


def _object_id(kind: bytes, body: bytes) -> bytes:
    return hashlib.sha1(kind + b" " + str(len(body)).encode() + b"\0" + body).digest()


def _tree_id(directory: Path, ignore: tuple[str, ...]) -> bytes | None:
    """The tree object's id, or None for a directory with no files (git does not track it)."""
    entries: list[tuple[bytes, bytes, bytes]] = []  # (sort key, mode, id)
    with os.scandir(directory) as scan:
        for entry in scan:
            if any(fnmatch.fnmatch(entry.name, pattern) for pattern in ignore):
                continue  # the same test as shutil.ignore_patterns, which the copy uses
            name = os.fsencode(entry.name)
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                mode, oid = b"120000", _object_id(b"blob", os.fsencode(os.readlink(entry.path)))
            elif stat.S_ISDIR(info.st_mode):
                subtree = _tree_id(Path(entry.path), ignore)
                if subtree is None:
                    continue
                # git sorts a tree's entries as if directory names ended with "/"
                entries.append((name + b"/", b"40000", subtree))
                continue
            else:
                mode = b"100755" if info.st_mode & stat.S_IXUSR else b"100644"
                oid = _object_id(b"blob", Path(entry.path).read_bytes())
            entries.append((name, mode, oid))
    if not entries:
        return None
    body = b"".join(
        mode + b" " + key.rstrip(b"/") + b"\0" + oid for key, mode, oid in sorted(entries)
    )
    return _object_id(b"tree", body)


def commit_hash(directory: Path, identity: CommitIdentity, ignore: tuple[str, ...] = ()) -> str:
    """The id of a parentless commit of every file under `directory`, leaving out names that
    match a glob in `ignore` (as `shutil.copytree(ignore=shutil.ignore_patterns(*ignore))`
    leaves them out of a copy)."""
    tree = _tree_id(directory, ignore) or _object_id(b"tree", b"")
    person = f"{identity.name} <{identity.email}> {identity.epoch_s} +0000".encode()
    body = (
        b"tree " + tree.hex().encode() + b"\n"
        b"author " + person + b"\n"
        b"committer " + person + b"\n"
        b"\n" + identity.message.encode() + b"\n"
    )
    return _object_id(b"commit", body).hex()


def tree_entries(
    directory: Path, ignore: tuple[str, ...] = ()
) -> dict[str, tuple[str, str]]:
    """Every file git would commit from `directory`, as {posix path: (mode, blob id)}: what
    `git ls-tree -r` prints for that commit, without git."""
    found: dict[str, tuple[str, str]] = {}

    def walk(current: Path, prefix: str) -> None:
        with os.scandir(current) as scan:
            for entry in scan:
                if any(fnmatch.fnmatch(entry.name, pattern) for pattern in ignore):
                    continue
                path = prefix + entry.name
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    target = os.fsencode(os.readlink(entry.path))
                    found[path] = ("120000", _object_id(b"blob", target).hex())
                elif stat.S_ISDIR(info.st_mode):
                    walk(Path(entry.path), path + "/")
                else:
                    mode = "100755" if info.st_mode & stat.S_IXUSR else "100644"
                    found[path] = (mode, _object_id(b"blob", Path(entry.path).read_bytes()).hex())

    walk(directory, "")
    return found
