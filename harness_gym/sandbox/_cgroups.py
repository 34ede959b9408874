"""A cgroup per sandbox on this host: a pids limit (a fork bomb stops at it) and an exact census
of the sandbox's processes, whatever they did to leave their session or scrub their environment.

Made where this host lets us: the pids controller of cgroup v2 (`/sys/fs/cgroup`, with `pids` in
its controllers and ours to delegate, e.g. root on a VM) or of cgroup v1 (`/sys/fs/cgroup/pids`,
writable: root). Elsewhere (an unprivileged user, a container with a read-only cgroupfs)
`SandboxCgroup.make` answers None and the backend goes without: no pids limit, and the census
falls back to what the backend has (bwrap's pid namespace, local's marker variables).

A command joins its sandbox's cgroup before it runs: it is started through `launcher()`, a
`sh` that writes its own pid into `cgroup.procs` and then execs the command, so nothing it forks
can be outside. Sandbox cgroups are named `<owner pid>-<sandbox id>` under `harness-gym/`; a new
backend kills and removes those whose owner is gone (a trainer killed by SIGKILL).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

_V2 = Path("/sys/fs/cgroup")
_V1_PIDS = Path("/sys/fs/cgroup/pids")
_DIR = "harness-gym"


def _write(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _enable_pids(cgroup: Path) -> bool:
    """Let the children of a v2 cgroup have a pids limit."""
    if "pids" in (cgroup / "cgroup.subtree_control").read_text().split():
        return True
    try:
        _write(cgroup / "cgroup.subtree_control", "+pids")
    except OSError:  # not ours, or it holds processes (the "no internal processes" rule)
        return False
    return True


@functools.cache
def cgroup_parent() -> Path | None:
    """The directory sandbox cgroups are made in, or None when this host lets us make none."""
    try:
        controllers = (_V2 / "cgroup.controllers").read_text().split()
    except OSError:
        controllers = []
    try:
        if "pids" in controllers:
            parent = _V2 / _DIR
            if not _enable_pids(_V2):
                return None
            parent.mkdir(exist_ok=True)
            return parent if _enable_pids(parent) else None
        if (_V1_PIDS / "cgroup.procs").is_file():
            parent = _V1_PIDS / _DIR
            parent.mkdir(exist_ok=True)
            return parent if os.access(parent / "cgroup.procs", os.W_OK) else None
    except OSError:
        return None
    return None


def _owner_alive(name: str) -> bool:
    pid = name.partition("-")[0]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


class SandboxCgroup:
    """One sandbox's cgroup (see module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, sandbox_id: str, pids_max: int) -> SandboxCgroup | None:
        """A new cgroup with `pids_max` as its limit, or None where none can be made."""
        parent = cgroup_parent()
        if parent is None:
            return None
        path = parent / f"{os.getpid()}-{sandbox_id}"
        try:
            path.mkdir()
            _write(path / "pids.max", str(pids_max))
        except OSError:
            try:
                path.rmdir()
            except OSError:
                pass
            return None
        return cls(path)

    def launcher(self) -> list[str]:
        """An argv prefix that puts the command into this cgroup, then runs it."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def pids(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill_all(self, timeout: float = 10.0) -> bool:
        """SIGKILL every process in the cgroup until none is left (forks race the first rounds;
        the pids limit bounds them). True when it is empty."""
        deadline = time.monotonic() + timeout
        kill = self.path / "cgroup.kill"  # v2, Linux 5.14+: atomic
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            try:
                _write(kill, "1")
            except OSError:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and remove the cgroup. Idempotent."""
        if not self.path.exists():
            return
        self.kill_all()
        for _ in range(200):  # the last killed processes leave the cgroup a moment later
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def reap_stale_cgroups() -> list[str]:
    """Kill and remove sandbox cgroups whose owner process is gone; their names."""
    parent = cgroup_parent()
    if parent is None:
        return []
    reaped = []
    for path in parent.iterdir():
        if path.is_dir() and not _owner_alive(path.name):
            SandboxCgroup(path).remove()
            reaped.append(path.name)
    return reaped
