"""Run a Python script as a throwaway non-root user (CI runs as root; the caps differ by user).

`run_as_user(script)` makes a user with `useradd` (no home, a fresh name), runs `script` with
this interpreter and this environment's packages as that user, and removes the user. This
interpreter may live under /root (pyenv), which other users cannot enter: the script runs in a
private mount namespace where /root is a read-only view holding only the dirs under it that
the interpreter and its packages need. Returns the CompletedProcess; `why_not()` says why it
cannot be done here (not root, no `useradd`/`unshare`/`setpriv`), for a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

_VIEW = r"""
set -e
view=$1; user=$2; shift 2
mount -t tmpfs -o mode=755 tmpfs "$view"
while [ "$1" != -- ]; do mkdir -p "$view/$1"; mount --rbind "/root/$1" "$view/$1"; shift; done
shift
mount --rbind "$view" /root
exec setpriv --reuid "$user" --regid "$user" --clear-groups "$@"
"""


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a throwaway user"
    missing = [t for t in ("useradd", "userdel", "unshare", "setpriv") if not shutil.which(t)]
    return f"needs {', '.join(missing)}" if missing else None


def _under_root() -> list[str]:
    """The first-level dirs under /root that this interpreter and its packages live in."""
    dirs = {sys.prefix, sys.base_prefix, *(p for p in sys.path if p)}
    tops = set()
    for d in dirs:
        path = Path(os.path.realpath(d))
        if path.is_relative_to("/root") and path != Path("/root"):
            tops.add(path.relative_to("/root").parts[0])
    return sorted(tops)


def run_as_user(script: str, *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    name = f"hg{uuid.uuid4().hex[:10]}"
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True, capture_output=True)
    home = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    view = Path(tempfile.mkdtemp(prefix="root-view-"))
    try:
        shutil.chown(home, name, name)
        path = home / "script.py"
        path.write_text(script)
        path.chmod(0o644)
        env = {**os.environ, "HOME": str(home), "TMPDIR": str(home)}
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _VIEW, "sh",
                str(view), name, *_under_root(), "--", sys.executable, str(path)]  # fmt: skip
        return subprocess.run(argv, env=env, cwd=str(home), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)  # its leftovers only
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
        view.rmdir()
