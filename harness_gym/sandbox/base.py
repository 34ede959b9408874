"""The sandbox seam: where a rollout's repository lives and where its commands run.

`SandboxBackend.create(spec)` gives a fresh, isolated `Sandbox` for one rollout. A sandbox runs
commands (`exec` to completion, `start` in the background as a `Job` in its own process group),
moves files in and out, `kill_processes()` ends everything its commands started (the episode
calls it between the agent's turn and grading), and `close()` removes everything it created.
Backends: `bwrap` (the default), `docker`, `local` (no isolation: never chosen for you), `e2b`,
`hf`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not be created, a command could not be started)."""


TIMEOUT_EXIT_CODE = 124  # what `timeout(1)` reports: a command killed at its deadline
DEFAULT_PIDS = 1024  # processes and threads per sandbox
DEFAULT_MEMORY_BYTES = 4 * 2**30
DEFAULT_DISK_BYTES = 4 * 2**30


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandbox may use: processes and threads, memory (all its processes together
    where a cgroup caps it; each process where only an rlimit can), bytes on disk. An env sets
    them from `EpisodeConfig.limits`; `SandboxBackend.caps()` says how each is enforced."""

    pids: int = DEFAULT_PIDS
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    disk_bytes: int = DEFAULT_DISK_BYTES

    def __post_init__(self) -> None:
        for name in ("pids", "memory_bytes", "disk_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SandboxError(f"SandboxLimits.{name} must be a positive int, got {value!r}")


CAP_NAMES = ("pids", "memory", "disk")


@dataclass(frozen=True)
class SandboxCaps:
    """How a backend's sandboxes are capped, measured on this host: for each of processes,
    memory and disk, a line saying by what (a cgroup, an rlimit, a tmpfs), or None where
    nothing caps it. `fixes` says, for each missing cap, how to get it."""

    pids: str | None
    memory: str | None
    disk: str | None
    fixes: Mapping[str, str] = field(default_factory=dict)

    def missing(self) -> list[str]:
        return [name for name in CAP_NAMES if getattr(self, name) is None]


@dataclass
class ExecResult:
    exit_code: int  # -signal when killed by a signal; 124 when the timeout fired
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass
class SandboxSpec:
    """What a rollout needs in its sandbox.

    `repo` is a host directory copied (with its .git) to `Sandbox.workdir`; `image` is for
    container backends; `env` is added to every command's environment (HOME always points at the
    sandbox's own home).

    `workdir` is where the repo already is inside `image` (a SWE-bench / SWE-rebench row's
    image holds its checkout at `/testbed`, at the row's base commit): nothing is copied and
    `Sandbox.workdir` is that path. Only backends that run images honour it (their backend
    class sets `runs_images = True`); give it with `repo=None`.

    `ro_mounts` maps host paths to the paths where commands see them, read-only: what the
    commands need from the host (a harness's install, its runtime), filled in by the episode
    layer, so a backend knows nothing of what runs in it. Backends that see the host's files
    (`local`) or none of them (cloud sandboxes) ignore it.
    """

    repo: Path | None = None
    image: str | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    label: str = "rollout"
    ro_mounts: Mapping[str, str] = field(default_factory=dict)


class Job(abc.ABC):
    """A background command in its own process group.

    Waiting is the same on every backend (`wait`): wait for the exit, kill the group at the
    deadline, then the result. A backend says how to wait (`_await_exit`), what the exit code
    was once the command ended (`_ended_code`) and where its output is (`_output`).
    """

    _started: float  # time.monotonic() when the command started
    _timed_out: bool = False  # a wait ran out and killed it: every later wait says so too

    def wait(self, timeout: float | None = None) -> ExecResult:
        """Wait for the command; on timeout kill its whole process group and return with
        `timed_out=True` (exit code 124)."""
        if not self._await_exit(timeout):
            self._timed_out = True
            self.kill()
        return self._result(*self._output())

    def _result(self, stdout: str, stderr: str) -> ExecResult:
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if self._timed_out else self._ended_code(),
            stdout=stdout,
            stderr=stderr,
            timed_out=self._timed_out,
            duration_s=time.monotonic() - self._started,
        )

    @abc.abstractmethod
    def _await_exit(self, timeout: float | None) -> bool:
        """Wait until the command ends (True) or `timeout` runs out (False)."""

    @abc.abstractmethod
    def _ended_code(self) -> int:
        """The exit code of a command that has ended (or was killed)."""

    @abc.abstractmethod
    def _output(self) -> tuple[str, str]:
        """What the command wrote to stdout and stderr (the last `OUTPUT_LIMIT_BYTES` each)."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill the whole process group now. Idempotent."""

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code if the command ended, else None."""


class Sandbox(abc.ABC):
    """One rollout's isolated machine: a working copy of the task repo and a fresh HOME."""

    workdir: str  # the repo's path as commands inside the sandbox see it
    home: str  # HOME as commands inside the sandbox see it
    # Why the sandbox stopped its commands on its own (a cap they hit: disk), else None. The
    # episode reads it after the harness ends: such an episode is a `harness_error`.
    fault: str | None = None
    # Whether a command may have run since the last `kill_processes()` that succeeded. Backends
    # that track it set it on every exec/start and clear it there; one that does not leaves it
    # True, and `quiesce()` then always kills.
    _may_have_processes: bool = True

    @abc.abstractmethod
    def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run to completion. A str runs under `bash -c` (not a login shell: /etc/profile
        resets PATH and drops the one the caller set). On timeout the process group is killed
        and `timed_out` is set."""

    @abc.abstractmethod
    def start(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdout_path: str | None = None,
    ) -> Job:
        """Start in the background, in its own process group."""

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None: ...

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes: ...

    @abc.abstractmethod
    def kill_processes(self) -> None:
        """Kill every process the sandbox's commands started, also those that left their
        process group or session (setsid, double forks, nohup, a scrubbed environment), and
        close the way to the proxy. Files stay and `exec` works afterwards: the episode calls
        this when the harness has ended, so that nothing the agent left running can touch the
        tree while the grader works in it. Raises `SandboxError` when it cannot confirm that
        the processes are gone."""

    def quiesce(self) -> None:
        """`kill_processes()`, unless no command ran since the last one. The grader calls it
        before it touches the tree, so `grade()` alone gives the guarantee an episode gives
        (nothing the agent left runs while it grades), and an episode, which already killed
        to read the harness's output, does not pay twice."""
        if self._may_have_processes:
            self.kill_processes()

    @abc.abstractmethod
    def close(self) -> None:
        """Kill everything still running and remove everything created. Idempotent."""

    def proxy_url(self, host_url: str) -> str:
        """The URL a command in this sandbox uses to reach the proxy serving at `host_url` on
        this host. Sandboxes that share the host's network use it as it is; an isolated network
        relays it (bwrap, docker: a unix socket, so the proxy is all they reach) and a cloud
        sandbox needs a public URL (e2b, hf)."""
        return host_url

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxBackend(abc.ABC):
    name: str = "unnamed"  # the entry-point name, for messages
    # Whether `create` honours `SandboxSpec.image` and `.workdir` (a dataset row's checkout
    # inside its image); only such a backend can run dataset rows.
    runs_images: bool = False

    @abc.abstractmethod
    def create(self, spec: SandboxSpec) -> Sandbox: ...

    def set_limits(self, limits: SandboxLimits) -> None:
        """Cap the sandboxes created from now on at `limits` (a backend with fixed or remote
        limits keeps them: `caps()` says what holds)."""

    def caps(self) -> SandboxCaps | None:
        """How this backend caps a sandbox's processes, memory and disk here; None where the
        backend does not say (the env then warns)."""
        return None

    def close(self) -> None:
        """Release backend-wide resources (clients, reapers)."""
