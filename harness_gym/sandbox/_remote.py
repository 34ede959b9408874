"""A sandbox driven through a remote shell API (the `e2b` and `hf` backends share it).

The command wrapper (output to files, exit codes that survive a killed wrapper), the kill of
every process carrying a job's marker (which catches `setsid` escapees), the per-rollout layout
(`work/`, `home/`, `tmp/`, `logs/` under one `mktemp -d`), the repo tarball, and the mapping of
the proxy's local URL to the public URL a cloud sandbox must use.
"""

from __future__ import annotations

import io
import posixpath
import shlex
import tarfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ._processes import JOB_MARKER, SANDBOX_MARKER
from .base import ExecResult, Job, Sandbox, SandboxError, SandboxSpec

TIMEOUT_EXIT_CODE = 124
KILLED_EXIT_CODE = 137  # what our wrapper shell reports for a SIGKILLed command

# -- the remote shell, shared with hf.py -------------------------------------------------------


def inner_command(command: Sequence[str] | str) -> str:
    """The user's command as one shell word list: a str runs under its own `bash -c`, so that
    `$$`, `exit` and `kill -9 $$` act on it, not on our wrapper."""
    if isinstance(command, str):
        return shlex.join(["bash", "-c", command])
    return shlex.join(list(command))


def exec_script(command: Sequence[str] | str, out: str, err: str, stdin: str) -> str:
    """Run `command` with its output in files, then print them and exit with its code.

    Output goes to files, not the SDK's pipes: a `cmd &` left behind would hold the pipes open
    and the call would not return although the command has exited. Not `exec`: the wrapper
    stays the parent, so a signal death reads as 128+n (137 for SIGKILL), as under bwrap.
    """
    q = shlex.quote
    return (
        f"{{ {inner_command(command)} ; }} > {q(out)} 2> {q(err)} < {q(stdin)}; code=$?; "
        f"cat {q(out)}; cat {q(err)} >&2; rm -f {q(out)} {q(err)}; exit $code"
    )


def job_script(
    command: Sequence[str] | str, out: str, err: str, exit_path: str | None = None
) -> str:
    """Run `command` with its output in files (and its exit code in `exit_path`, for an SDK
    that may forget a finished process)."""
    q = shlex.quote
    record = f"echo $code > {q(exit_path)}; " if exit_path else ""
    return (
        f'mkdir -p "$(dirname {q(out)})" && '
        f"{{ {inner_command(command)} ; }} > {q(out)} 2> {q(err)} < /dev/null; code=$?; "
        f"{record}exit $code"
    )


def kill_marked_script(var: str, value: str, rounds: int = 50) -> str:
    """Kill every process in the sandbox whose environment holds `var=value`, until none is
    left: the remote twin of `_processes.kill_marked` (setsid escapees leave the process group
    the SDK's kill reaches, but keep our markers)."""
    pattern = shlex.quote(f"{var}={value}")
    return (
        f"for i in $(seq {rounds}); do "
        f"pids=$(grep -slzxF {pattern} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); "
        '[ -z "$pids" ] && break; kill -9 $pids 2>/dev/null; sleep 0.01; done; true'
    )


LAYOUT_SCRIPT = (
    "root=$(mktemp -d -t harness-gym-XXXXXX) && mkdir -p $root/work $root/home $root/tmp "
    '$root/logs && echo "$root"'
)


def repo_tarball(repo: Path) -> bytes:
    """The repo, .git and symlinks included, as one gzipped tar: one upload, not one per file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        tar.add(repo, arcname=".")
    return buffer.getvalue()


def untar_script(tarball: str, workdir: str) -> str:
    q = shlex.quote
    return (
        f"tar -xzf {q(tarball)} -C {q(workdir)} --no-same-owner && rm -f {q(tarball)}"
    )


def public_base_url(proxy_public_url: str | None, local_url: str, backend: str) -> str:
    """`local_url` (the proxy's loopback URL) with its scheme and host replaced by the public
    URL the user exposed the proxy at."""
    if not proxy_public_url:
        raise SandboxError(
            f"the {backend} sandbox runs in the cloud and cannot reach the proxy at {local_url}:"
            f" expose the proxy at a public URL and pass it as proxy_public_url=..."
        )
    public, local = urlsplit(proxy_public_url), urlsplit(local_url)
    path = public.path.rstrip("/") + local.path
    return urlunsplit((public.scheme, public.netloc, path, local.query, ""))


class RemoteShellSandbox(Sandbox):
    """What the e2b and hf sandboxes share: paths, environment, markers, files over commands.

    Subclasses run one wrapped bash script (`_run_script`) and move bytes (`_put`, `_get`).
    """

    backend_name = "remote"
    proxy_public_url: str | None = None  # set by the backend: where the proxy is exposed

    def proxy_url(self, host_url: str) -> str:
        return public_base_url(self.proxy_public_url, host_url, self.backend_name)

    def __init__(self, spec: SandboxSpec) -> None:
        self.id = uuid.uuid4().hex[:16]  # HARNESS_GYM_SANDBOX_ID of every command
        self._spec = spec
        self._closed = False
        self._lock = threading.Lock()
        self._jobs: list[Job] = []

    def _make_layout(self) -> None:
        result = self._run_script(LAYOUT_SCRIPT, {}, None, 60)
        root = result.stdout.strip()
        if result.exit_code != 0 or not root.startswith("/"):
            raise SandboxError(
                f"could not make the sandbox layout: {result.stderr or root!r}"
            )
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

    # -- what a subclass provides ----------------------------------------------------------

    def _run_script(
        self,
        script: str,
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float | None,
    ) -> ExecResult:
        """Run a bash script to completion; on timeout return `timed_out=True` (the caller
        kills what is left)."""
        raise NotImplementedError

    def _put(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    def _get(self, path: str) -> bytes:
        raise NotImplementedError

    def _destroy(self) -> None:
        raise NotImplementedError

    # -- shared plumbing -------------------------------------------------------------------

    def path(self, path: str) -> str:
        return posixpath.join(self.workdir, path)

    def _command_env(
        self, env: Mapping[str, str] | None, job_id: str
    ) -> dict[str, str]:
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
        try:
            return self._get(path).decode("utf-8", errors="replace")
        except SandboxError:
            return ""

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
        self._check_open()
        job_id = uuid.uuid4().hex
        out, err = self._log_path("out"), self._log_path("err")
        stdin_path = "/dev/null"
        if stdin is not None:
            stdin_path = self._log_path("stdin")
            self._put(stdin_path, stdin)
        started = time.monotonic()
        script = exec_script(command, out, err, stdin_path)
        result = self._run_script(
            script, self._command_env(env, job_id), self._cwd(cwd), timeout
        )
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

    def _cwd(self, cwd: str | None) -> str:
        return self.path(cwd) if cwd else self.workdir

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        target = self.path(path)
        self._put(target, data.encode() if isinstance(data, str) else data)
        # The SDKs take no mode (or an undocumented one): set it with chmod, always, so the
        # result does not depend on the server's default or umask.
        chmod = self._run_script(f"chmod {mode:o} {shlex.quote(target)}", {}, None, 60)
        if chmod.exit_code != 0:
            raise SandboxError(
                f"could not chmod {path} in sandbox {self.id}: {chmod.stderr}"
            )

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return self._get(self.path(path))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            getattr(job, "forget", lambda: None)()
        self._destroy()  # the whole VM goes: every process and file with it


# -- E2B ---------------------------------------------------------------------------------------
