"""The `local` sandbox: a temp dir and a process group per command, on the host itself.

No isolation beyond the filesystem layout and a clean environment: commands see the host's
files and network, and can write wherever the host user can (a `.pth` in this interpreter's
site-packages runs in every later grading). So `local` is never chosen for you
(`default_sandbox()` picks `bwrap` or `docker`), and creating the backend warns with
`UnisolatedSandboxWarning`: it is for debugging a harness, not for training.

What it does guarantee is cleanup (DESIGN invariant 5): every command runs in its own session,
a timeout kills the whole group, and killing a job, `kill_processes()` or closing the sandbox
also kills processes that left the group with setsid(), found by marker variables
(HARNESS_GYM_JOB_ID, HARNESS_GYM_SANDBOX_ID) in their environment. Where util-linux can make
one (root, or a non-root user with user namespaces), the sandbox's commands all run in a pid
namespace of its own (`_pidns.py`), which `kill_processes()` and `close()` kill whole: exact,
whatever a process did (`env -i` + setsid included); background children still outlive the
command that started them, as before. Where this host lets us make cgroups (root), every command
also runs in the sandbox's own cgroup (`_cgroups.py`), which caps the sandbox's processes
(`pids`, so a fork bomb stops there). With neither, a process that scrubbed its environment
(`env -i`) and left its session escapes.

Caps (`SandboxLimits`; `caps()` says which hold here): processes and memory by the sandbox's
cgroup where one can be made (root), else by rlimits (`_rlimits.py`: RLIMIT_NPROC inside a user
namespace of the command's own, which a non-root user can make; RLIMIT_DATA per process);
`disk_bytes` on the sandbox's tree (a check while the agent runs, `_disk.py`: over it, the
sandbox kills its processes and sets `fault`), RLIMIT_FSIZE at the same size on every command.
A process the kernel killed at the cgroup's memory cap also sets `fault`, and so does a process
table held full (`_pids.py`: a fork bomb ends its episode at once, not at the timeout). What
`exec`/`Job.wait` return of a command's output is its last `OUTPUT_LIMIT_BYTES`.

Layout of one sandbox (all under one `harness-gym-*` temp dir, removed by `close()`)::

    work/   copy of the task repo, .git included   (Sandbox.workdir)
    home/   an empty HOME for the harness's state  (Sandbox.home)
    tmp/    TMPDIR, so temp files die with the sandbox
    logs/   stdout/stderr files of commands (outside work/, so they never show in the diff)
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from . import _pids, _pidns
from . import _processes as procs
from . import _rlimits
from ._cgroups import SandboxCgroup, cgroup_parent, memory_parent, reap_stale_cgroups
from ._disk import DiskWatch
from ._pids import CgroupCensus, MarkedCensus, PidsWatch
from ._watch import TurnWatch
from .base import (
    DEFAULT_DISK_BYTES,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_PIDS,
    ExecResult,
    Job,
    Sandbox,
    SandboxBackend,
    SandboxCaps,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
)

__all__ = ["DEFAULT_DISK_BYTES", "DEFAULT_MEMORY_BYTES", "DEFAULT_PIDS", "SandboxLimits"]

# What `exec` and `Job.wait` keep of a command's stdout and of its stderr: the last 32 MiB (an
# agent that prints gigabytes must not take the trainer's memory with it).
OUTPUT_LIMIT_BYTES = 32 * 2**20


class UnisolatedSandboxWarning(UserWarning):
    """A sandbox backend that does not isolate the agent from the host (`local`): an agent can
    write into the interpreter that grades it, leave processes behind, reach host services."""


# Variables passed through from the host; everything else (API keys, tokens, HTTP_PROXY, which
# would send a CLI's loopback traffic to a corporate proxy) stays out.
_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME")


def _base_env(root: Path, marker: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSTHROUGH if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        TERM="dumb",
        NO_COLOR="1",
        SHELL="/bin/bash",
        TMPDIR=str(root / "tmp"),
        NO_PROXY="127.0.0.1,localhost,::1",
        no_proxy="127.0.0.1,localhost,::1",
    )
    env[procs.SANDBOX_MARKER] = marker
    return env


def _argv(command: Sequence[str] | str) -> list[str]:
    # Not `bash -lc`: a login shell sources /etc/profile, which on Debian resets PATH for root
    # and drops the PATH the caller gave (a task's venv python silently became /usr/bin/python).
    return ["bash", "-c", command] if isinstance(command, str) else list(command)


def _read_text(path: Path, limit: int = OUTPUT_LIMIT_BYTES) -> str:
    """The file's last `limit` bytes as text ("" when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - limit))
            return handle.read(limit).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


@functools.cache
def _local_nproc_prefix() -> tuple[str, ...] | None:
    """The user-namespace prefix under which RLIMIT_NPROC caps a local command, measured; None
    where it does not (root, no user namespaces). Only where no pid namespace can be made: in
    one, the sandbox's user namespace is the scope (`_pidns`)."""
    userns = tuple(_rlimits.in_user_namespace())
    return userns if userns and _rlimits.nproc_works(userns) else None


def _nproc_scope() -> str | None:
    """How RLIMIT_NPROC caps a local sandbox's processes here, or None where it does not."""
    method = _pidns.how()
    if method is not None:
        together = "in the sandbox's user namespace (all its commands together)"
        return together if method.nproc else None
    return "in a user namespace per command (each command and all it starts)" if (
        _local_nproc_prefix()) else None


def host_caps(limits: SandboxLimits, nproc: str | None, backend: str) -> SandboxCaps:
    """What caps a `local`/`bwrap` sandbox's processes, memory and disk on this host, given
    whether RLIMIT_NPROC can be had (`nproc`: how, or None)."""
    fixes = {}
    prlimit = bool(_rlimits.prlimit(fsize=1))
    if cgroup_parent() is not None:
        pids = f"cgroup pids.max={limits.pids} (the sandbox's processes together)"
    elif nproc is not None:
        pids = f"RLIMIT_NPROC={limits.pids} {nproc} (each command and all it starts)"
    else:
        pids = None
        fixes["pids"] = (
            f"no cgroup can be made here and RLIMIT_NPROC does not hold for this user "
            f"(uid {os.geteuid()}; root is exempt from it): run as root where /sys/fs/cgroup "
            "is writable (a VM, or a container with its own writable cgroupfs), or as a "
            "non-root user on Linux 5.14+ with user namespaces allowed (sysctl "
            "user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1), or delegate "
            "a cgroup (`systemd-run --user --scope -p Delegate=yes ...`), or use "
            f"sandbox='docker'; the {backend!r} backend cannot cap processes otherwise"
        )
    mib = limits.memory_bytes // 2**20
    if memory_parent() is not None:
        memory = f"cgroup memory limit {mib} MiB (the sandbox's processes together)"
    elif prlimit:
        memory = f"RLIMIT_DATA={mib} MiB (each process)"
    else:
        memory = None
        fixes["memory"] = "install util-linux (`prlimit`), or run where a cgroup can be made"
    disk = f"a check of the tree at {limits.disk_bytes // 2**20} MiB" + (
        " and RLIMIT_FSIZE" if prlimit else " (no RLIMIT_FSIZE: install util-linux)"
    )
    return SandboxCaps(pids=pids, memory=memory, disk=disk, fixes=fixes)


class LocalJob(Job):
    """A command running in its own session; stdout and stderr go to two files."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        job_id: str,
        stdout_path: Path,
        stderr_path: Path,
        started: float,
    ) -> None:
        self._proc = proc
        self.pid = proc.pid  # == its process group id and session id
        self.id = job_id  # HARNESS_GYM_JOB_ID of the command and all it starts
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self._started = started
        self._timed_out = False
        self._code: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return procs.peek_exit(self._proc)

    def _await_exit(self, timeout: float | None) -> bool:
        self._code = procs.wait_exit(self._proc, timeout)
        return self._code is not None

    def _ended_code(self) -> int:
        assert self._code is not None, "_await_exit saw the exit"
        return self._code

    def _output(self) -> tuple[str, str]:
        return _read_text(self.stdout_path), _read_text(self.stderr_path)

    def kill(self) -> None:
        """SIGKILL the group, also when the leader has already exited (a harness that exits
        leaves the dev server its agent started running), and whatever left the group with
        setsid (Pi runs each bash tool call in a new session)."""
        with self._lock:
            tree = procs.descendants(self._proc.pid) if self._proc.returncode is None else []
            procs.kill_group_and_reap(self._proc)
            procs.kill_marked(procs.JOB_MARKER, self.id)
            procs.wait_gone(tree)

    def reap(self) -> None:
        """Collect the exited leader without touching the rest of its group."""
        with self._lock:
            if procs.peek_exit(self._proc) is not None:
                self._proc.wait()


class LocalSandbox(Sandbox):
    job_class: type[LocalJob] = LocalJob

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits | None = None) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.limits = limits or SandboxLimits()
        self.root = Path(tempfile.mkdtemp(prefix="harness-gym-"))
        self._jobs: list[LocalJob] = []
        self._closed = False
        self._lock = threading.Lock()
        self._cgroup: SandboxCgroup | None = None
        method = self._pid_namespace_method()
        self._pidns = _pidns.PidNamespace(method) if method is not None else None
        try:
            work = self.root / "work"
            if spec.repo is not None:
                shutil.copytree(spec.repo, work, symlinks=True)
            else:
                work.mkdir()
            for sub in ("home", "tmp", "logs"):
                (self.root / sub).mkdir()
            self._cgroup = SandboxCgroup.make(self.id, self.limits.pids, self.limits.memory_bytes)
        except BaseException as exc:
            shutil.rmtree(self.root, ignore_errors=True)
            raise SandboxError(f"could not create a sandbox from {spec.repo}: {exc}") from exc
        self.workdir = str(work)
        self.home = str(self.root / "home")
        self._env = _base_env(self.root, self.id)
        self._env.update(spec.env)
        # Processes: the cgroup, else RLIMIT_NPROC where it holds (`_nproc_prefix`); memory:
        # the cgroup's limit, else RLIMIT_DATA for each process.
        in_namespace = self._pidns is not None and self._pidns.method.nproc
        per_command = self._pidns is None and self._nproc_prefix() is not None
        self._nproc = self._cgroup is None and (in_namespace or per_command)
        memory_in_cgroup = self._cgroup is not None and self._cgroup.memory is not None
        rlimits = _rlimits.prlimit(
            fsize=self.limits.disk_bytes,
            data=None if memory_in_cgroup else self.limits.memory_bytes,
        )
        self._memory_scope = "sandbox" if memory_in_cgroup else ("process" if rlimits else None)
        self._outer = [*(self._cgroup.launcher() if self._cgroup else []), *rlimits]
        self._inner = self._nproc_launcher()
        # The agent's turn is watched for the caps no kernel limit ends it at (disk; a process
        # table held full): from `start()` to `kill_processes()` or `close()`.
        self._watches: list[TurnWatch] = [
            DiskWatch(self.root, self.limits.disk_bytes, self._disk_exceeded)]
        census = (CgroupCensus(self._cgroup.path) if self._cgroup is not None
                  else MarkedCensus(procs.SANDBOX_MARKER, self.id) if self._nproc else None)
        if census is not None:  # no process cap, no table to fill
            self._watches.append(PidsWatch(census, self.limits.pids, self._pids_full))

    def _nproc_prefix(self) -> tuple[str, ...] | None:
        return _local_nproc_prefix()

    def _pid_namespace_method(self) -> _pidns.Method | None:
        return _pidns.how()

    def _nproc_launcher(self) -> list[str]:
        """What goes right before the command to cap its processes by RLIMIT_NPROC: a user
        namespace of its own, then the rlimit inside it (see `_rlimits`)."""
        if not self._nproc:
            return []
        if self._pidns is not None:  # already in the sandbox's user namespace
            return _rlimits.prlimit(nproc=self.limits.pids)
        prefix = self._nproc_prefix()
        return [] if prefix is None else [*prefix, *_rlimits.prlimit(nproc=self.limits.pids)]

    @property
    def pids_limited(self) -> bool:
        """Whether this sandbox's processes are capped: by its cgroup, or by RLIMIT_NPROC in a
        user namespace per command (see module doc)."""
        return self._cgroup is not None or self._nproc

    @property
    def memory_limited(self) -> Literal["sandbox", "process"] | None:
        """"sandbox" when a cgroup caps its processes' memory together, "process" when
        RLIMIT_DATA caps each, None when nothing does."""
        return self._memory_scope

    def _check_memory_kills(self) -> None:
        if self._cgroup is not None and self.fault is None and self._cgroup.memory_kills():
            self.fault = (
                f"a process of the sandbox went over its memory cap of "
                f"{self.limits.memory_bytes / 2**20:.0f} MiB and the kernel killed it"
            )

    def _disk_exceeded(self, used: int) -> None:
        self._stop_for(
            f"the sandbox's files grew to {used / 2**20:.0f} MiB, past its disk cap of "
            f"{self.limits.disk_bytes / 2**20:.0f} MiB: its processes were killed"
        )

    def _pids_full(self, limit: int) -> None:
        self._stop_for(
            f"the sandbox's processes held its process cap of {limit} for {_pids.HELD_S:g} s "
            f"with forks refused (a fork bomb or a runaway): its processes were killed"
        )

    def _stop_for(self, fault: str) -> None:
        """A watch found a cap broken: record why, and kill the sandbox's processes."""
        self.fault = fault
        try:
            self._kill_all()
        except SandboxError:
            pass  # close() tries again

    def _stop_watches(self) -> None:
        for watch in self._watches:
            watch.stop()

    # -- paths and environment -------------------------------------------------------------

    def path(self, path: str) -> Path:
        """A sandbox path on the host: relative paths are relative to the work dir."""
        return Path(self.workdir, path)

    def _command_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = {**self._env, **(env or {})}
        merged["HOME"] = self.home
        merged[procs.SANDBOX_MARKER] = self.id
        return merged

    def _log_path(self, kind: str) -> Path:
        return self.root / "logs" / f"{uuid.uuid4().hex[:12]}.{kind}"

    def _spawn(
        self,
        command: Sequence[str] | str,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdout_path: Path,
        stdin_path: Path | None,
        background: bool = False,
    ) -> LocalJob:
        self._check_open()
        self._may_have_processes = True
        job_id = uuid.uuid4().hex
        stderr_path = stdout_path.with_name(stdout_path.name + ".stderr")
        stdout_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            with (
                open(stdout_path, "wb") as out,
                open(stderr_path, "wb") as err,
                open(stdin_path or os.devnull, "rb") as stdin,
            ):
                where = str(self.path(cwd)) if cwd else self.workdir
                namespace = self._pidns.prefix(where) if self._pidns is not None else []
                proc = subprocess.Popen(
                    [*self._outer, *namespace, *self._inner, *_argv(command)],
                    cwd=where,
                    env={**self._command_env(env), procs.JOB_MARKER: job_id},
                    stdin=stdin,  # never the host's: a CLI that reads stdin would hang on it
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
        except OSError as exc:
            raise SandboxError(f"could not start {command!r}: {exc}") from exc
        job = self.job_class(proc, job_id, stdout_path, stderr_path, started)
        with self._lock:
            self._jobs.append(job)
        return job

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.root} is closed")

    # -- the seam --------------------------------------------------------------------------

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        # Output goes to files, not pipes: with pipes, a `cmd &` left behind holds them open
        # and the read never ends although the command itself has exited.
        stdin_path = None
        if stdin is not None:
            stdin_path = self._log_path("stdin")
            stdin_path.write_bytes(stdin)
        job = self._spawn(command, cwd, env, self._log_path("out"), stdin_path)
        result = job.wait(timeout)
        job.reap()  # anything it left running in the background dies at close()
        with self._lock:
            self._jobs.remove(job)
        for path in (job.stdout_path, job.stderr_path, stdin_path):
            if path is not None:
                path.unlink(missing_ok=True)
        return result

    def start(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdout_path: str | None = None,
    ) -> LocalJob:
        """Start in the background. stdout goes to `stdout_path` (default: a file under the
        sandbox's logs/), stderr to the same path plus `.stderr`."""
        out = self.path(stdout_path) if stdout_path else self._log_path("out")
        job = self._spawn(command, cwd, env, out, None, background=True)
        for watch in self._watches:  # the agent's turn: a harness runs in the background
            watch.start()
        return job

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)

    def read_file(self, path: str) -> bytes:
        try:
            return self.path(path).read_bytes()
        except OSError as exc:
            raise SandboxError(f"could not read {path} in sandbox {self.root}: {exc}") from exc

    def _kill_all(self) -> None:
        """Kill every job's processes, the marked escapees, and whatever the cgroup still
        holds."""
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.kill()
        if self._pidns is not None:
            self._pidns.kill()  # exact: nothing the sandbox started outlives its namespace
        procs.kill_marked(procs.SANDBOX_MARKER, self.id)
        if self._cgroup is not None and not self._cgroup.kill_all():
            left = self._cgroup.pids()
            raise SandboxError(f"sandbox {self.id}: processes {left[:10]} survived SIGKILL")

    def kill_processes(self) -> None:
        """Kill everything the sandbox's commands started (see `Sandbox.kill_processes`).
        Exact where the sandbox has a pid namespace (`_pidns`) or a cgroup; else processes
        that scrubbed their environment and left their session escape (the module doc)."""
        self._check_open()
        self._stop_watches()
        self._kill_all()
        self._check_memory_kills()
        self._may_have_processes = False

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_watches()
        try:
            self._kill_all()
        finally:
            with self._lock:
                self._jobs = []
            if self._cgroup is not None:
                self._cgroup.remove()
            _rmtree(self.root)


def _rmtree(root: Path) -> None:
    """Remove a tree that may hold read-only dirs (Go's module cache, chmod'ed fixtures)."""

    def make_writable_and_retry(func: Callable[[str], object], path: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, stat.S_IRWXU)
            func(path)
        except FileNotFoundError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(root, onexc=make_writable_and_retry)
    else:
        shutil.rmtree(root, onerror=make_writable_and_retry)


class LocalSandboxBackend(SandboxBackend):
    """Sandboxes as temp dirs on this host. Isolation: filesystem layout and env only; not
    safe for training (it warns once, `UnisolatedSandboxWarning`). `pids` and `disk_bytes`
    cap each sandbox (see module doc)."""

    name = "local"

    def __init__(
        self,
        *,
        pids: int = DEFAULT_PIDS,
        disk_bytes: int = DEFAULT_DISK_BYTES,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        self.limits = SandboxLimits(pids=pids, memory_bytes=memory_bytes, disk_bytes=disk_bytes)
        reap_stale_cgroups()
        if type(self) is LocalSandboxBackend:
            warnings.warn(
                "the 'local' sandbox does not isolate the agent: it can write into the "
                "interpreter that grades it, leave processes behind and reach host services. "
                "Use it to debug a harness, not to train; sandbox='bwrap' or 'docker' isolate.",
                UnisolatedSandboxWarning,
                stacklevel=2,
            )

    def set_limits(self, limits: SandboxLimits) -> None:
        self.limits = limits

    def caps(self) -> SandboxCaps:
        return host_caps(self.limits, _nproc_scope(), self.name)

    def create(self, spec: SandboxSpec) -> LocalSandbox:
        return LocalSandbox(spec, self.limits)
