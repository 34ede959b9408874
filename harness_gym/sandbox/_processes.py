"""Process-group plumbing for the local sandbox: wait with a deadline, kill a group, find escapees.

The leader of a group is left a zombie (waited on with `WNOWAIT`) until its group has been
killed: while the zombie exists its pid, and so the group id, cannot be reused, so `killpg`
never hits an unrelated process group that happens to get the same number.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

SANDBOX_MARKER = "HARNESS_GYM_SANDBOX_ID"  # set on every command of a sandbox
JOB_MARKER = "HARNESS_GYM_JOB_ID"  # set on one command and everything it starts


def wait_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> int | None:
    """Wait until `proc` exits, without reaping it; its exit code, or None on timeout."""
    code = peek_exit(proc)
    if code is not None:
        return code
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        fd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):  # pre-5.3 kernel: fall back to polling
        fd = None
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if fd is not None:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                poller.poll(None if left is None else int(left * 1000) + 1)
            else:
                time.sleep(0.02 if left is None else min(0.02, left))
            code = peek_exit(proc)
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                return None
    finally:
        if fd is not None:
            os.close(fd)


def peek_exit(proc: subprocess.Popen[bytes]) -> int | None:
    """The exit code (-signal when killed) if `proc` has exited; the zombie is left in place."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.wait()  # already reaped elsewhere (e.g. subprocess' own cleanup)
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def kill_group_and_reap(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the whole process group of `proc` (its own session), then reap the leader."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.wait()


def marked_pids(var: str, value: str) -> list[int]:
    """Pids whose initial environment holds `var=value`.

    A process that called setsid() leaves our process group, so killpg misses it; its
    environment still carries the markers we set. Pi, for one, runs every bash tool call
    `detached` (in a new session): killing Pi's group left the agent's `sleep 1000` running.
    A process started with a scrubbed environment (`env -i`) is not found.
    """
    needle = f"{var}={value}".encode()
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(var: str, value: str, rounds: int = 50) -> None:
    """SIGKILL every process carrying `var=value`, again until none is left (forks race us)."""
    for _ in range(rounds):
        pids = marked_pids(var, value)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (its threads' children included)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
        return found
    except FileNotFoundError:  # gone, or a kernel without CONFIG_PROC_CHILDREN: scan
        pass
    except OSError:
        return found
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """`pid`'s children, their children, and so on: a snapshot."""
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _runs(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float = 2.0) -> None:
    """Until none of `pids` runs (gone, or a zombie), at most `timeout` s. A SIGKILL is sent,
    not yet done, when kill() returns; and killing a bwrap's outer process ends the commands in
    its pid namespace only as that namespace is torn down, after the kill returned: without
    this wait, a non-root bwrap sandbox's escapee still ran after kill_processes()."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _runs(pid)]
        if left:
            time.sleep(0.005)
