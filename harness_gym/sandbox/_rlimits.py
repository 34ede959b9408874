"""Caps from rlimits, for sandboxes on this host where no cgroup can be made (`local`, `bwrap`).

- processes: RLIMIT_NPROC counts the processes (threads included) of one real uid, machine-wide,
  so set on a plain command it would count the trainer's and every other rollout's processes
  too, and it does not apply to root at all (uid 0 is exempt). Since Linux 5.14 the count is
  kept per user namespace: set *inside* a fresh user namespace, it counts that namespace's
  processes only (the levels above check against the limit the namespace's creator had, which
  is left alone). So it is set inside: bwrap run by a non-root user makes a user namespace for
  each command anyway; `local` runs the command under `unshare --user --map-current-user`. It
  caps each command (a harness and all it starts), not the sandbox's commands together. Root
  gets no process cap from it: a cgroup is the only one.
- memory: RLIMIT_DATA (a process's private writable memory: heap, anonymous mappings; not the
  address space Node or Go reserve without touching) caps each process, not the sandbox's
  processes together. A cgroup's memory limit, where there is one, caps them together.
- disk: RLIMIT_FSIZE caps each file; `_disk.py` watches the tree.

`nproc_works(prefix)` measures that the process cap holds with a given launch prefix: a command
that tries to start more processes than the limit must be stopped.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

PROBE_LIMIT = 16


def prlimit(*, fsize: int | None = None, data: int | None = None, nproc: int | None = None
            ) -> list[str]:  # fmt: skip
    """An argv prefix setting the given rlimits (soft and hard), or [] where util-linux's
    `prlimit` is missing or nothing is asked."""
    limits = [f"--{name}={value}:{value}" for name, value in
              (("fsize", fsize), ("data", data), ("nproc", nproc)) if value is not None]  # fmt: skip
    if not limits or shutil.which("prlimit") is None:
        return []
    return ["prlimit", *limits, "--"]


def in_user_namespace() -> list[str]:
    """An argv prefix that runs the command in a user namespace of its own, the current user
    mapped to itself, or [] where that cannot be done here."""
    prefix = ["unshare", "--user", "--map-current-user"]
    return prefix if shutil.which("unshare") and _runs(prefix + ["true"]) else []


_PROBE = f"""
import os, sys, time
started = 0
for _ in range({PROBE_LIMIT * 4}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    started += 1
print(started)
"""


@functools.cache
def nproc_works(outer: tuple[str, ...], inner: tuple[str, ...] = ()) -> bool:
    """Whether RLIMIT_NPROC at PROBE_LIMIT, set by `inner` (after the `outer` prefix, e.g. a
    user namespace), stops a command that forks four times as many processes (measured)."""
    if os.geteuid() == 0 and not outer:
        return False  # root is exempt from RLIMIT_NPROC in its own namespace
    argv = [*outer, *inner, *prlimit(nproc=PROBE_LIMIT), sys.executable, "-I", "-c", _PROBE]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    said = done.stdout.strip()
    return done.returncode == 0 and said.isdigit() and int(said) < PROBE_LIMIT


def _runs(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
