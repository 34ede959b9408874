"""A node runner's own directory on its node, and the reaping of what dead runners left there.

Everything a `NodeRunner` makes on disk (sandbox dirs, materialized repos, a docker backend's
run dir) goes under `<tmp>/harness-gym-runners/<runner id>/`: the runner points `tempfile` and
`TMPDIR` at it, so code below it needs no change. An `owner.json` names the process that owns
the directory (pid, start time, boot id), and every process an episode starts runs with its
HOME and TMPDIR inside it (the sandboxes set both), so "what this runner left behind" is
decidable after the runner is gone: the directory, and the processes whose environment or
working directory points into it.

Why: a node lost mid-step left its sandbox and repo dirs behind, and after a SIGTERM its Pi CLIs
ran on, orphaned, for ~35 s (measured, issue 18). A runner that dies cannot clean up, so two
others do it for it:

- its guard: a small process started with the runner and detached from it (double-forked into
  its own session, so neither Ray's kill of a dead worker's children nor a process-group kill
  takes it along) that waits for the runner's pid to exit, then kills the runner's processes
  and removes its directory. This covers SIGKILL, SIGTERM, a killed raylet and a driver that
  exits without `close()` (Ray then kills its actors).
- the next runner on the node: `claim()` first reaps every workspace whose owner is gone (a
  guard killed too, a reboot), so nothing accumulates.

A clean `release()` does the same for itself and stops its guard.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Standard library only: the guard runs this file as a script (-I), in ~10 MB and 0.3 s, where
# importing the package would take 40 MB and over a second per runner.

RUNNERS_DIR = "harness-gym-runners"
OWNER_FILE = "owner.json"
# A workspace without an owner file is one being created right now, unless it is this old.
UNCLAIMED_GRACE_S = 120.0
KILL_ROUNDS = 50  # processes may fork while we kill them: sweep until none is left


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (with the boot id, a reused pid reads
    as another process), or None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Owner:
    """The process that owns a workspace."""

    pid: int
    start: str
    boot_id: str
    host: str

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, _start_time(pid) or "", _boot_id(), socket.gethostname())

    @classmethod
    def read(cls, workspace: Path) -> Owner | None:
        try:
            return cls(**json.loads((workspace / OWNER_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def is_alive(self) -> bool:
        if self.host != socket.gethostname():
            return True  # a directory shared between machines: not ours to judge
        if self.boot_id != _boot_id():
            return False  # the machine rebooted since
        return _start_time(self.pid) == self.start


def workspace_pids(workspace: Path) -> list[int]:
    """Live processes whose environment (HOME, TMPDIR, ...) or working directory lies in
    `workspace`: the CLIs, tool calls and test runs of its episodes, also those that left
    their process group with setsid(). Not found: a process that scrubbed its environment
    and left the directory (bwrap's pid namespace still takes those down with the CLI)."""
    root = str(workspace)
    inside = (root.encode(), (root + "/").encode())
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            if cwd == root or cwd.startswith(root + "/"):
                found.append(int(entry.name))
                continue
            for var in (entry / "environ").read_bytes().split(b"\0"):
                value = var.partition(b"=")[2]
                if value == inside[0] or value.startswith(inside[1]):
                    found.append(int(entry.name))
                    break
        except OSError:  # gone, or not ours to read
            continue
    return found


def reap(workspace: Path) -> None:
    """Kill every process of `workspace` (again until none is left), then remove it."""
    for _ in range(KILL_ROUNDS):
        pids = workspace_pids(workspace)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    if workspace.exists():
        _rmtree(workspace)


def _rmtree(root: Path) -> None:
    """Remove a tree that may hold read-only dirs (a Go module cache, chmod'ed fixtures).

    The twin of `sandbox.local._rmtree`, kept apart on purpose: this file also runs on its own
    as the guard process (`python runner_workspace.py`), with nothing but the stdlib."""

    def make_writable_and_retry(func, path, _exc):  # noqa: ANN001 - shutil's callback
        try:
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, stat.S_IRWXU)
            func(path)
        except FileNotFoundError:
            pass

    shutil.rmtree(root, onerror=make_writable_and_retry)


def reap_stale(base: Path) -> list[Path]:
    """Reap every workspace under `base` whose owner is gone; the ones reaped."""
    reaped = []
    for workspace in sorted(base.iterdir()) if base.is_dir() else []:
        if not workspace.is_dir():
            continue
        owner = Owner.read(workspace)
        if owner is None:
            try:
                age = time.time() - workspace.stat().st_mtime
            except OSError:
                continue
            if age < UNCLAIMED_GRACE_S:
                continue
        elif owner.is_alive():
            continue
        reap(workspace)
        reaped.append(workspace)
    return reaped


def default_base() -> Path:
    """Where runners on this node keep their workspaces: `$TMPDIR/harness-gym-runners`."""
    return Path(tempfile.gettempdir()) / RUNNERS_DIR


class RunnerWorkspace:
    """One runner's directory, its guard, and this process's temp dir pointed at it."""

    def __init__(self, path: Path, guard_pid: int | None) -> None:
        self.path = path
        self.guard_pid = guard_pid
        self._saved_tempdir: tuple[str | None, str | None] | None = None

    @classmethod
    def claim(cls, runner_id: str, base: Path | None = None) -> RunnerWorkspace:
        """Reap dead runners' workspaces under `base`, make this process's own, start its
        guard, and send this process's temp files there."""
        base = default_base() if base is None else base
        base.mkdir(parents=True, exist_ok=True)
        reap_stale(base)
        path = base / runner_id
        path.mkdir()
        owner = Owner.current()
        (path / OWNER_FILE).write_text(json.dumps(asdict(owner)))
        workspace = cls(path, start_guard(path, owner))
        workspace._enter()
        return workspace

    def _enter(self) -> None:
        self._saved_tempdir = (tempfile.tempdir, os.environ.get("TMPDIR"))
        tempfile.tempdir = str(self.path)
        os.environ["TMPDIR"] = str(self.path)

    def release(self) -> None:
        """Kill what is left of this runner's processes, remove the directory, stop the guard.
        Idempotent."""
        if self._saved_tempdir is not None:
            tempdir, env = self._saved_tempdir
            self._saved_tempdir = None
            tempfile.tempdir = tempdir
            if env is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = env
        reap(self.path)
        guard, self.guard_pid = self.guard_pid, None
        if guard is not None:
            try:
                os.kill(guard, signal.SIGTERM)
            except ProcessLookupError:
                pass


def start_guard(workspace: Path, owner: Owner) -> int:
    """Start the guard of `workspace` (see the module docstring); its pid."""
    # Started before TMPDIR points into the workspace: the guard is not one of its processes.
    launcher = subprocess.Popen(
        [sys.executable, "-I", __file__, "guard", str(workspace), str(owner.pid), owner.start],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        cwd="/", start_new_session=True,
    )
    out, _ = launcher.communicate(timeout=30)
    return int(out.split()[0])


def _guard(workspace: Path, pid: int, start: str) -> None:
    """Wait for the owner to exit, then reap its workspace."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        fd = None
    while _start_time(pid) == start:
        if fd is not None:
            select.select([fd], [], [], 5.0)
        else:
            time.sleep(1.0)
    reap(workspace)


def main(argv: list[str]) -> None:
    if len(argv) != 4 or argv[0] != "guard":
        raise SystemExit(f"usage: python {__file__} guard DIR PID START")
    workspace, pid, start = Path(argv[1]), int(argv[2]), argv[3]
    if os.fork():  # the launcher says the guard's pid and exits: the guard is nobody's child
        return
    os.setsid()
    print(os.getpid(), flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the launcher's reader sees EOF
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a clean release stops us
    _guard(workspace, pid, start)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
