"""The `hf` sandbox: one Hugging Face Jobs sandbox per rollout, through `huggingface_hub.Sandbox`.

Install with `pip install harness-gym[hf]` (huggingface_hub 2.4 or newer, where `Sandbox` is)
and log in (`HF_TOKEN`, or `hf auth login`). Written against huggingface_hub 2.4's
`huggingface_hub/_sandbox.py`: `Sandbox.create(image, *, flavor, idle_timeout, env, token)`,
`run(cmd, *, shell, env, cwd, timeout, stdin, check, background)` (a timeout kills the whole
process group and sets `timed_out`; `background=True` returns a `SandboxProcess` and no output),
`processes()`, `files.read/write`, `kill()` (ends the job) and `close()` (drops the client only).

Reaching the proxy works as for `e2b` (see that module): the sandbox is a cloud job, so pass
`HFSandboxBackend(proxy_public_url=...)`; the env gives the harness `sandbox.proxy_url(url)`.
(`Sandbox.proxy_url_for` is the other direction: a public URL for a server *inside* the
sandbox.) The command wrapper, layout and marker kill are the e2b backend's.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._remote import (
    KILLED_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    RemoteShellSandbox,
    job_script,
)
from .base import ExecResult, Job, SandboxBackend, SandboxError, SandboxSpec

NEEDED_VERSION = "huggingface_hub>=2.4"


class HFJob(Job):
    """A background `SandboxProcess`. The SDK gives no output and no wait for one: output goes
    to files the wrapper writes, its exit code to one more, and `wait` polls `processes()`."""

    def __init__(self, sandbox: HFSandbox, process: Any, job_id: str, out: str) -> None:
        self._sandbox = sandbox
        self._process = process
        self.id = job_id
        self.stdout_path, self.stderr_path, self.exit_path = (
            out,
            out + ".stderr",
            out + ".exit",
        )
        self._started = time.monotonic()
        self._code: int | None = None
        self._timed_out = False

    def poll(self) -> int | None:
        if self._code is not None or self._sandbox._closed:
            return self._code if self._code is not None else -9
        listed = [p for p in self._sandbox.sdk.processes() if self._is_mine(p)]
        if listed and listed[0].running:
            return None
        self._code = self._exit_code(listed[0] if listed else None)
        return self._code

    def _is_mine(self, process: Any) -> bool:
        if self._process.id is not None:
            return process.id == self._process.id
        return process.pid == self._process.pid

    def _exit_code(self, process: Any) -> int:
        written = self._sandbox._read_text(self.exit_path).strip()
        if written.lstrip("-").isdigit():
            return int(written)
        if process is not None and process.exit_code is not None:
            return process.exit_code
        return KILLED_EXIT_CODE  # gone without writing its code: killed

    def wait(self, timeout: float | None = None) -> ExecResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.02
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                self._timed_out = True
                self.kill()
                break
            time.sleep(
                pause
                if deadline is None
                else min(pause, max(0.0, deadline - time.monotonic()))
            )
            pause = min(pause * 2, 0.5)  # each poll is an HTTP round-trip
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if self._timed_out else (self.poll() or 0),
            stdout=self._sandbox._read_text(self.stdout_path),
            stderr=self._sandbox._read_text(self.stderr_path),
            timed_out=self._timed_out,
            duration_s=time.monotonic() - self._started,
        )

    def kill(self) -> None:
        if self._sandbox._closed:
            return
        if self._code is None:
            from huggingface_hub.errors import SandboxError as HubSandboxError

            with contextlib.suppress(HubSandboxError):  # already gone
                self._process.kill()  # the group; setsid escapees need the marker kill below
        self._sandbox.kill_job(self.id)
        if self._code is None:
            self._code = self._exit_code(None)


class HFSandbox(RemoteShellSandbox):
    backend_name = "hf"

    def __init__(self, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self.sdk = sdk_sandbox  # the huggingface_hub.Sandbox, e.g. for proxy_url_for
        try:
            self._make_layout()
        except BaseException:
            self._destroy()
            raise

    def _run_script(
        self,
        script: str,
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float | None,
    ) -> ExecResult:
        started = time.monotonic()
        try:
            result = self.sdk.run(
                ["bash", "-c", script],
                shell=False,
                env=dict(env) or None,
                cwd=cwd,
                timeout=timeout,
                check=False,  # a non-zero exit is a result, not an error
            )
        except Exception as exc:
            raise SandboxError(
                f"hf sandbox {self.id}: command failed to run: {exc}"
            ) from exc
        if result.timed_out:
            return ExecResult(
                TIMEOUT_EXIT_CODE, result.stdout, result.stderr, timed_out=True
            )
        code = result.exit_code
        if code is None:
            code = -(result.signal or 9)
        return ExecResult(
            code, result.stdout, result.stderr, duration_s=time.monotonic() - started
        )

    def start(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdout_path: str | None = None,
    ) -> HFJob:
        """Start in the background. stdout goes to `stdout_path` (default: a file under the
        sandbox's logs/), stderr to the same path plus `.stderr`, as in the local backend."""
        self._check_open()
        job_id = uuid.uuid4().hex
        out = self.path(stdout_path) if stdout_path else self._log_path("out")
        script = job_script(command, out, out + ".stderr", out + ".exit")
        try:
            process = self.sdk.run(
                ["bash", "-c", script],
                shell=False,
                env=self._command_env(env, job_id),
                cwd=self._cwd(cwd),
                background=True,
            )
        except Exception as exc:
            raise SandboxError(
                f"could not start {command!r} in hf sandbox {self.id}: {exc}"
            ) from exc
        job = HFJob(self, process, job_id, out)
        with self._lock:
            self._jobs.append(job)
        return job

    def _put(self, path: str, data: bytes) -> None:
        try:
            self.sdk.files.write(path, data)
        except Exception as exc:
            raise SandboxError(
                f"could not write {path} in hf sandbox {self.id}: {exc}"
            ) from exc

    def _get(self, path: str) -> bytes:
        try:
            return self.sdk.files.read(path)
        except Exception as exc:
            raise SandboxError(
                f"could not read {path} in hf sandbox {self.id}: {exc}"
            ) from exc

    def _destroy(self) -> None:
        # Cancels the job and closes the client; the SDK logs a failure rather than raising,
        # and a later kill() retries.
        self.sdk.kill()


class HFSandboxBackend(SandboxBackend):
    """Sandboxes as Hugging Face Jobs (one dedicated job each).

    >>> backend = HFSandboxBackend(image="python:3.12",
    ...                            proxy_public_url="https://proxy.example.com")  # doctest: +SKIP

    `image` needs bash, tar and the harness CLIs (`SandboxSpec.image` overrides it per
    rollout). `sandbox_factory` replaces `huggingface_hub.Sandbox.create` (tests pass a fake).
    """

    name = "hf"

    def __init__(
        self,
        *,
        image: str = "python:3.12",
        flavor: str = "cpu-basic",
        idle_timeout: float | str | None = 600,
        token: str | None = None,
        proxy_public_url: str | None = None,
        env: Mapping[str, str] | None = None,
        sandbox_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.image = image
        self.flavor = flavor
        self.idle_timeout = idle_timeout
        self.token = token
        self.proxy_public_url = proxy_public_url
        self.env = dict(env or {})
        self._factory = sandbox_factory

    def _sdk_factory(self) -> tuple[Callable[..., Any], str | None]:
        if self._factory is not None:
            return self._factory, self.token
        try:
            from huggingface_hub import Sandbox as SdkSandbox
            from huggingface_hub import get_token
        except ImportError as exc:
            raise SandboxError(
                f"the hf sandbox needs huggingface_hub.Sandbox: pip install '{NEEDED_VERSION}'"
                " (or 'harness-gym[hf]')"
            ) from exc
        token = self.token or get_token()
        if not token:
            raise SandboxError(
                "the hf sandbox needs a Hugging Face token: set HF_TOKEN, run `hf auth login`,"
                " or pass HFSandboxBackend(token=...)"
            )
        return SdkSandbox.create, token

    def create(self, spec: SandboxSpec) -> HFSandbox:
        factory, token = self._sdk_factory()
        kwargs: dict[str, Any] = {
            "image": spec.image or self.image,
            "flavor": self.flavor,
            "idle_timeout": self.idle_timeout,
            "env": self.env or None,
        }
        if token is not None:
            kwargs["token"] = token
        try:
            sdk_sandbox = factory(**kwargs)
        except Exception as exc:
            raise SandboxError(
                f"could not create an hf sandbox: {exc} (is HF_TOKEN set and allowed to run Jobs?)"
            ) from exc
        sandbox = HFSandbox(sdk_sandbox, spec)
        sandbox.proxy_public_url = self.proxy_public_url
        return sandbox
