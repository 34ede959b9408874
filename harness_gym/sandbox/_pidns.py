"""One pid namespace per `local` sandbox: killing it kills everything the sandbox started.

No process can leave a pid namespace, whatever it does (setsid, double fork, `env -i`, a new
process group), so the namespace is a mark the agent cannot scrub. The sandbox's namespace is
made by `unshare --pid --fork --kill-child --mount-proc` around a small reaper that is its pid 1
(it reaps orphans, which would otherwise pile up as zombies and count against the process cap);
every command joins it with `nsenter`. A non-root user makes a user namespace with it
(`--user --map-current-user`, joined with `--user --preserve-credentials`): RLIMIT_NPROC set in
a command then counts the processes of every command of the sandbox together (the count is per
user namespace). `kill()` SIGKILLs the reaper: the kernel then kills every other process in the
namespace, and `unshare` (our child) exits only after the reaper is reaped, which happens only
once the namespace is empty, so when `kill()` returns nothing of the sandbox runs: exact. The
next command makes a fresh namespace. `setpriv --pdeathsig KILL` ties `unshare` to the trainer
(a trainer killed outright takes the namespace with it).

`how()` measures what works on this host (as this user), once per process; None where nothing
does (no util-linux, user namespaces off for a non-root user): `local` then falls back to
process groups and marker variables, and says so.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from . import _processes as procs
from . import _rlimits

# pid 1 of the namespace: reaps every child, orphans included; SIGCHLD is waited for, not
# handled, so no exit is missed between a reap and the wait.
_REAPER = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    signal.sigwaitinfo({signal.SIGCHLD})
"""


@dataclass(frozen=True)
class Method:
    unshare: tuple[str, ...]  # argv prefix that makes the namespace (before the reaper's argv)
    enter: tuple[str, ...]  # nsenter options that join it (after `-t PID`)
    nproc: bool  # RLIMIT_NPROC set in a joined command caps the sandbox's processes (measured)


def _start(method: Method) -> tuple[subprocess.Popen[bytes], int]:
    """Start a namespace's reaper; (the unshare process, the reaper's host pid)."""
    lifetime = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
    proc = subprocess.Popen(
        [*lifetime, *method.unshare, sys.executable, "-I", "-S", "-c", _REAPER],
        # Not the trainer's environment: the sandbox's processes can read their pid 1's
        # (/proc/1/environ), and the trainer's holds API keys.
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = procs.children(proc.pid)
        if found:
            return proc, found[0]
        if proc.poll() is not None:
            break
        time.sleep(0.005)
    _stop(proc, None)
    raise OSError(f"{' '.join(method.unshare)} did not start a reaper")


def _stop(proc: subprocess.Popen[bytes], reaper: int | None) -> None:
    if reaper is not None:
        try:
            os.kill(reaper, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _works(method: Method) -> bool:
    try:
        proc, reaper = _start(method)
    except OSError:
        return False
    try:
        argv = ["nsenter", "-t", str(reaper), *method.enter, "--", "true"]
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        _stop(proc, reaper)


def _nproc_holds(method: Method) -> bool:
    if os.geteuid() == 0:
        return False  # root is exempt from RLIMIT_NPROC: its cap is the cgroup's
    proc, reaper = _start(method)
    try:
        return _rlimits.nproc_works(("nsenter", "-t", str(reaper), *method.enter, "--"))
    finally:
        _stop(proc, reaper)


@functools.cache
def how() -> Method | None:
    """What makes and joins a sandbox's pid namespace here, measured; None where nothing does."""
    if not (shutil.which("unshare") and shutil.which("nsenter")):
        return None
    user = os.geteuid() != 0
    make_user = ("--user", "--map-current-user") if user else ()
    join_user = ("--user", "--preserve-credentials") if user else ()
    for mount in (True, False):  # a private /proc shows the namespace's own pids; else the host's
        method = Method(
            unshare=("unshare", *make_user, "--pid", "--fork", "--kill-child",
                     *(("--mount-proc",) if mount else ())),  # fmt: skip
            enter=(*join_user, "--pid", *(("--mount",) if mount else ())),
            nproc=False,
        )
        if _works(method):
            return Method(method.unshare, method.enter, _nproc_holds(method))
    return None


class PidNamespace:
    """A sandbox's pid namespace, made on first use and again after each `kill()`."""

    def __init__(self, method: Method) -> None:
        self.method = method
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: int | None = None

    def prefix(self, cwd: str) -> list[str]:
        """The argv prefix that runs a command in the namespace, in `cwd`. Joining a mount
        namespace moves a process to its root, and nsenter's own `--wd` opens the directory
        before it joins, leaving a cwd outside the namespace's tree: getcwd() then fails with
        ENOENT (Codex exits on it). So `env --chdir` moves there from inside."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc, self._reaper = _start(self.method)
            return ["nsenter", "-t", str(self._reaper), *self.method.enter, "--",
                    "env", f"--chdir={cwd}", "--"]

    def kill(self) -> None:
        """Kill every process in the namespace; returns once none is left (see module doc)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:
                _stop(proc, self._reaper)
