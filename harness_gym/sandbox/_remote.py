"""What the `e2b` and `hf` backends share: a sandbox, a background job and a backend driven
through a cloud SDK's remote shell.

A subclass says how to run one bash script (`_run_script`), start one in the background
(`_start_job`), read a file (`_get`), stop the machine (`_stop_once`) and what an SDK
error means (`_sdk_error`). The rest is here: the per-rollout layout, every command's
environment and markers, `exec`, files, a job's output and exit code, the marker kill, and a
stop that is retried until the service confirms it (`_reaper.py`). The shell scripts are in
`_remote_shell.py`.

A dead or unreachable machine is a `SandboxError` from every call, never a timed-out or failed
command: the episode then ends `infra_error`, which trainers drop, instead of `timeout`.
"""

from __future__ import annotations

import contextlib
import posixpath
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ._processes import JOB_MARKER, SANDBOX_MARKER
from ._reaper import CloudReaper
from ._remote_shell import (
    KILLED_EXIT_CODE,
    LAYOUT_SCRIPT,
    exec_script,
    job_script,
    kill_marked_script,
    public_base_url,
    repo_tarball,
    untar_script,
)
from .base import (
    TIMEOUT_EXIT_CODE,
    ExecResult,
    Job,
    Sandbox,
    SandboxBackend,
    SandboxCaps,
    SandboxError,
    SandboxSpec,
)


class RemoteShellSandbox(Sandbox):
    """A cloud machine for one rollout: the repo under `work/`, a fresh `home/`, commands run
    by a bash wrapper that keeps their output in files."""

    backend_name: ClassVar[str] = "remote"

    def __init__(self, sdk: Any, spec: SandboxSpec, backend: RemoteShellBackend) -> None:
        self.id = uuid.uuid4().hex[:16]  # HARNESS_GYM_SANDBOX_ID of every command
        self.sdk = sdk  # the SDK's sandbox object, for what the seam does not cover
        self._spec = spec
        self._backend = backend
        self._closed = False
        self._lock = threading.Lock()
        self._jobs: list[RemoteJob] = []
        try:
            self._make_layout()
        except BaseException:
            self._stop()
            raise

    # -- what a subclass provides ----------------------------------------------------------

    @property
    def remote_id(self) -> str:
        """The service's name for this machine (an E2B sandbox id, an HF job id)."""
        raise NotImplementedError

    def _run_script(
        self, script: str, env: Mapping[str, str], cwd: str | None, timeout: float | None
    ) -> ExecResult:
        """Run a bash script to completion. When `timeout` runs out, return `timed_out=True`
        (the caller kills what is left); when the machine failed, raise `SandboxError`."""
        raise NotImplementedError

    def _start_job(
        self, script: str, env: Mapping[str, str], cwd: str, job_id: str, out: str
    ) -> RemoteJob:
        """Start a bash script in the background."""
        raise NotImplementedError

    def _put(self, path: str, data: bytes) -> None:
        with self._sdk_call(f"write {path}"):
            self.sdk.files.write(path, data)  # the same call in both SDKs

    def _get(self, path: str) -> bytes:
        raise NotImplementedError

    def _stop_once(self) -> bool:
        """Ask the service to end the machine (every process and file goes with it); True once
        it confirms that the machine is gone. May raise: the reaper tries again."""
        raise NotImplementedError

    def _sdk_error(self, what: str, exc: Exception) -> SandboxError:
        """Our error for an SDK exception raised while doing `what`."""
        return SandboxError(
            f"{self.backend_name} sandbox {self.remote_id}: could not {what}:"
            f" {type(exc).__name__}: {exc}"
        )

    # -- shared plumbing -------------------------------------------------------------------

    @contextlib.contextmanager
    def _sdk_call(self, what: str) -> Iterator[None]:
        """Every SDK exception leaves as a `SandboxError` that says what failed."""
        try:
            yield
        except SandboxError:
            raise
        except Exception as exc:
            raise self._sdk_error(what, exc) from exc

    def _make_layout(self) -> None:
        result = self._run_script(LAYOUT_SCRIPT, {}, None, 60)
        root = result.stdout.strip()
        if result.exit_code != 0 or not root.startswith("/"):
            raise SandboxError(f"could not make the sandbox layout: {result.stderr or root!r}")
        self.root = root
        self.workdir = f"{root}/work"
        self.home = f"{root}/home"
        self._env = {
            "TERM": "dumb",
            "NO_COLOR": "1",
            "SHELL": "/bin/bash",
            "TMPDIR": f"{root}/tmp",
            **self._spec.env,
            SANDBOX_MARKER: self.id,
        }
        if self._spec.repo is not None:
            tarball = f"{root}/logs/repo.tar.gz"
            self._put(tarball, repo_tarball(Path(self._spec.repo)))
            untar = self._run_script(untar_script(tarball, self.workdir), {}, None, 600)
            if untar.exit_code != 0:
                raise SandboxError(
                    f"could not unpack {self._spec.repo} in the sandbox: {untar.stderr}"
                )

    def path(self, path: str) -> str:
        return posixpath.join(self.workdir, path)

    def _cwd(self, cwd: str | None) -> str:
        return self.path(cwd) if cwd else self.workdir

    def _command_env(self, env: Mapping[str, str] | None, job_id: str) -> dict[str, str]:
        merged = {**self._env, **(env or {})}
        merged["HOME"] = self.home
        merged[SANDBOX_MARKER] = self.id
        merged[JOB_MARKER] = job_id
        return merged

    def _log_path(self, kind: str) -> str:
        return f"{self.root}/logs/{uuid.uuid4().hex[:12]}.{kind}"

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{self.backend_name} sandbox {self.id} is closed")

    def kill_job(self, job_id: str) -> None:
        self._run_script(kill_marked_script(JOB_MARKER, job_id), {}, None, 60)

    def _read_text(self, path: str) -> str:
        """A command's output file, or "" where it cannot be read (never written, machine gone:
        the call that matters reports that)."""
        try:
            return self._get(path).decode("utf-8", errors="replace")
        except SandboxError:
            return ""

    def _stop(self) -> None:
        self._backend.reaper.stop(self.remote_id, self._stop_once)

    # -- the seam --------------------------------------------------------------------------

    def proxy_url(self, host_url: str) -> str:
        return public_base_url(self._backend.proxy_public_url, host_url, self.backend_name)

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._check_open()
        self._may_have_processes = True
        job_id = uuid.uuid4().hex
        out, err = self._log_path("out"), self._log_path("err")
        stdin_path = "/dev/null"
        if stdin is not None:
            stdin_path = self._log_path("stdin")
            self._put(stdin_path, stdin)
        started = time.monotonic()
        script = exec_script(command, out, err, stdin_path)
        result = self._run_script(script, self._command_env(env, job_id), self._cwd(cwd), timeout)
        if result.timed_out:
            self.kill_job(job_id)
            result = ExecResult(
                exit_code=TIMEOUT_EXIT_CODE,
                stdout=self._read_text(out),
                stderr=self._read_text(err),
                timed_out=True,
            )
        result.duration_s = time.monotonic() - started
        return result

    def start(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdout_path: str | None = None,
    ) -> RemoteJob:
        """Start in the background. stdout goes to `stdout_path` (default: a file under the
        sandbox's logs/), stderr to the same path plus `.stderr`, as in the local backend."""
        self._check_open()
        self._may_have_processes = True
        job_id = uuid.uuid4().hex
        out = self.path(stdout_path) if stdout_path else self._log_path("out")
        script = job_script(command, out, f"{out}.stderr", f"{out}.exit")
        with self._sdk_call(f"start {command!r}"):
            env_ = self._command_env(env, job_id)
            job = self._start_job(script, env_, self._cwd(cwd), job_id, out)
        with self._lock:
            self._jobs.append(job)
        return job

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        target = self.path(path)
        self._put(target, data.encode() if isinstance(data, str) else data)
        # The SDKs take no mode (or an undocumented one): set it with chmod, always, so the
        # result does not depend on the server's default or umask.
        chmod = self._run_script(f"chmod {mode:o} {shlex.quote(target)}", {}, None, 60)
        if chmod.exit_code != 0:
            raise SandboxError(f"could not chmod {path} in sandbox {self.id}: {chmod.stderr}")

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return self._get(self.path(path))

    def kill_processes(self) -> None:
        """Kill every job and every process carrying this sandbox's marker. Best effort, as in
        `local`: a process that scrubbed its environment escapes the marker search."""
        self._check_open()
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.kill()
        self._run_script(kill_marked_script(SANDBOX_MARKER, self.id), {}, None, 60)
        self._may_have_processes = False

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.forget()
        self._stop()  # the whole machine goes: every process and file with it


class RemoteJob(Job):
    """A background command whose output and exit code the wrapper writes to files
    (`job_script`). A subclass says how to wait for the SDK's process and how to kill it."""

    def __init__(self, sandbox: RemoteShellSandbox, job_id: str, out: str) -> None:
        self._sandbox = sandbox
        self.id = job_id
        self.stdout_path, self.stderr_path, self.exit_path = out, f"{out}.stderr", f"{out}.exit"
        self._started = time.monotonic()
        self._code: int | None = None
        self._killed = False
        self._timed_out = False
        self._lost: Exception | None = None  # why we lost the command (its machine died)

    def _kill_process(self) -> None:
        """Kill the SDK's process; one that is gone already is no error."""
        raise NotImplementedError

    def _written_exit_code(self) -> int | None:
        written = self._sandbox._read_text(self.exit_path).strip()
        return int(written) if written.lstrip("-").isdigit() else None

    def _check_lost(self) -> None:
        if self._lost is not None and not self._killed:
            raise self._sandbox._sdk_error(f"follow background job {self.id}", self._lost)

    def _ended_code(self) -> int:
        code = self.poll()
        return KILLED_EXIT_CODE if code is None else code

    def _output(self) -> tuple[str, str]:
        return (self._sandbox._read_text(self.stdout_path),
                self._sandbox._read_text(self.stderr_path))

    def kill(self) -> None:
        if self._sandbox._closed:
            return
        if self._code is None and self._lost is None:
            self._killed = True
            with self._sandbox._sdk_call(f"kill background job {self.id}"):
                self._kill_process()  # the group; setsid escapees need the marker kill below
        self._sandbox.kill_job(self.id)

    def forget(self) -> None:
        """The sandbox is closing: whatever happens to the command now is no news."""
        self._killed = True


class RemoteShellBackend(SandboxBackend):
    """What the e2b and hf backends share: the SDK's create call, the proxy's public URL and
    a reaper that makes sure every machine is stopped."""

    sandbox_class: ClassVar[type[RemoteShellSandbox]]
    how_to_stop: ClassVar[str]  # a command that stops a machine by hand, {id} for its id

    def caps(self) -> SandboxCaps:
        """Each rollout is a machine of its own: what it exhausts is its own, not this host."""
        vm = f"the {self.name} machine of the rollout's own (the provider's size)"
        return SandboxCaps(pids=vm, memory=vm, disk=vm)

    def __init__(
        self,
        *,
        proxy_public_url: str | None,
        sandbox_factory: Callable[..., Any] | None,
        stop_delays_s: Sequence[float],
    ) -> None:
        self.proxy_public_url = proxy_public_url
        self._factory = sandbox_factory
        self.reaper = CloudReaper(self.name, self.how_to_stop, stop_delays_s)

    def _sdk_create(self, spec: SandboxSpec) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The SDK's create function and its keyword arguments for `spec`; `SandboxError` for
        a spec this backend cannot run or a missing credential."""
        raise NotImplementedError

    def _create_error(self, exc: Exception) -> SandboxError:
        return SandboxError(f"could not create an {self.name} sandbox: {exc}")

    def create(self, spec: SandboxSpec) -> RemoteShellSandbox:
        if spec.workdir is not None:
            raise SandboxError(
                f"the {self.name} sandbox copies the task's repo in; it cannot use one that lives"
                f" inside an image (workdir={spec.workdir!r}): run such rows with"
                ' sandbox="docker"'
            )
        factory, kwargs = self._sdk_create(spec)
        try:
            sdk_sandbox = factory(**kwargs)
        except Exception as exc:
            raise self._create_error(exc) from exc
        return self.sandbox_class(sdk_sandbox, spec, self)

    def close(self) -> None:
        """Try once more to stop every machine that would not stop (each is warned about)."""
        self.reaper.sweep()
