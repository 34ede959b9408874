"""A cgroup per sandbox on this host: a pids limit (a fork bomb stops at it), a memory limit (the
sandbox's processes together; past it the kernel OOM-kills one of them, and only one of them),
and an exact census of the sandbox's processes, whatever they did to leave their session or
scrub their environment.

Made where this host lets us: the pids (and memory) controller of cgroup v2 (`/sys/fs/cgroup`,
with the controller in its controllers and ours to delegate, e.g. root on a VM) or of cgroup v1
(`/sys/fs/cgroup/pids`, `/sys/fs/cgroup/memory`, writable: root). Elsewhere (an unprivileged
user, a container with a read-only cgroupfs) `SandboxCgroup.make` answers None and the backend
falls back to rlimits (`_rlimits.py`), and the census to what the backend has (bwrap's pid
namespace, local's marker variables). The memory limit is had where the memory controller is;
`SandboxCgroup.memory` is None where it is not.

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


_V1_MEMORY = Path("/sys/fs/cgroup/memory")


def _enable(cgroup: Path, controller: str = "pids") -> bool:
    """Let the children of a v2 cgroup have limits of `controller`."""
    if controller in (cgroup / "cgroup.subtree_control").read_text().split():
        return True
    try:
        _write(cgroup / "cgroup.subtree_control", f"+{controller}")
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
            if not _enable(_V2):
                return None
            parent.mkdir(exist_ok=True)
            return parent if _enable(parent) else None
        if (_V1_PIDS / "cgroup.procs").is_file():
            parent = _V1_PIDS / _DIR
            parent.mkdir(exist_ok=True)
            return parent if os.access(parent / "cgroup.procs", os.W_OK) else None
    except OSError:
        return None
    return None


@functools.cache
def memory_parent() -> Path | None:
    """Where sandbox cgroups get their memory limit: the v2 parent above (one directory has
    both limits) when the memory controller can be delegated to it, else v1's memory hierarchy
    where it is ours (root); None where neither is."""
    parent = cgroup_parent()
    try:
        if parent is not None and parent.is_relative_to(_V2) and not parent.is_relative_to(_V1_PIDS):
            if "memory" in (_V2 / "cgroup.controllers").read_text().split():
                return parent if _enable(_V2, "memory") and _enable(parent, "memory") else None
            return None
        if (_V1_MEMORY / "cgroup.procs").is_file():
            # Below our own memory cgroup, so the sandboxes stay inside whatever caps us.
            path = _V1_MEMORY / _own_v1_path("memory") / _DIR
            path.mkdir(exist_ok=True)
            return path if os.access(path / "cgroup.procs", os.W_OK) else None
    except OSError:
        return None
    return None


def _own_v1_path(controller: str) -> str:
    """This process's cgroup in a v1 hierarchy, relative to its root ("" at the root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return ""


def _owner_alive(name: str) -> bool:
    pid = name.partition("-")[0]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


class SandboxCgroup:
    """One sandbox's cgroup (see module doc)."""

    def __init__(self, path: Path, memory: Path | None = None) -> None:
        self.path = path  # the pids cgroup: the census and the kill
        self.memory = memory  # the memory cgroup (the same dir on v2), or None: no memory cap

    @classmethod
    def make(cls, sandbox_id: str, pids_max: int, memory_max: int | None = None
             ) -> SandboxCgroup | None:  # fmt: skip
        """A new cgroup with `pids_max` (and `memory_max` bytes, where the memory controller
        is ours) as its limits, or None where none can be made."""
        parent = cgroup_parent()
        if parent is None:
            return None
        name = f"{os.getpid()}-{sandbox_id}"
        path = parent / name
        try:
            path.mkdir()
        except OSError:
            return None
        try:
            _write(path / "pids.max", str(pids_max))
        except OSError:
            _rmdirs([path])
            return None
        memory = memory_parent() if memory_max is not None else None
        if memory is not None:
            memory = memory / name
            try:
                if memory != path:
                    memory.mkdir()
                _set_memory(memory, memory_max or 0)
            except OSError:  # keep the pids cap; `memory` None says there is no memory cap
                if memory != path:
                    _rmdirs([memory])
                memory = None
        return cls(path, memory)

    def launcher(self) -> list[str]:
        """An argv prefix that puts the command into this cgroup, then runs it."""
        procs = [str(self.path / "cgroup.procs")]
        if self.memory is not None and self.memory != self.path:
            procs.append(str(self.memory / "cgroup.procs"))
        join = " && ".join(f'echo $$ > "${i}"' for i in range(len(procs)))
        return ["sh", "-c", f'{join} && shift {len(procs) - 1} && exec "$@"', *procs]

    def memory_kills(self) -> int:
        """How many of its processes the kernel killed for going over the memory cap."""
        if self.memory is None:
            return 0
        for name in ("memory.events", "memory.oom_control"):  # v2, v1
            try:
                for line in (self.memory / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                continue
        return 0

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
        if self.path.exists():
            self.kill_all()
        _rmdirs([self.path] + ([self.memory] if self.memory not in (None, self.path) else []))


def _rmdirs(paths: list[Path]) -> None:
    for path in paths:
        for _ in range(200):  # the last killed processes leave the cgroup a moment later
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _set_memory(path: Path, limit: int) -> None:
    """`limit` bytes of memory, swap included, for the cgroup at `path` (v2 or v1)."""
    if (path / "memory.max").exists():
        _write(path / "memory.max", str(limit))
        if (path / "memory.swap.max").exists():
            _write(path / "memory.swap.max", "0")
        return
    _write(path / "memory.limit_in_bytes", str(limit))
    if (path / "memory.memsw.limit_in_bytes").exists():  # only with swap accounting on
        try:
            _write(path / "memory.memsw.limit_in_bytes", str(limit))
        except OSError:
            pass


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
    memory = memory_parent()
    if memory is not None and memory != parent:
        for path in memory.iterdir():
            if path.is_dir() and not _owner_alive(path.name):
                _rmdirs([path])
    return reaped
