"""The `hf` sandbox: one Hugging Face Jobs sandbox per rollout, through `huggingface_hub.Sandbox`.

Install with `pip install harness-gym[hf]` (huggingface_hub 2.4 or newer, where `Sandbox` is)
and log in (`HF_TOKEN`, or `hf auth login`). Written against huggingface_hub 2.4's
`huggingface_hub/_sandbox.py`: `Sandbox.create(image, *, flavor, idle_timeout, env, namespace,
token)`, `run(cmd, *, shell, env, cwd, timeout, check, background)` (a timeout kills the whole
process group and sets `timed_out`; `background=True` returns a `SandboxProcess` and no
output), `processes()`, `files.read/write`, `kill()` and `close()` (drops the client only).

Stopping a job for certain. `Sandbox.kill()` cancels the job, but when the cancel fails it logs
a warning and returns: the job keeps running, billed, until its idle timeout. So a close checks
the job's stage with `HfApi.inspect_job` and cancels again (`HfApi.cancel_job`) with backoff
until the stage is terminal; a job that will not stop is named in an `UnstoppedSandboxWarning`
and tried again when the backend closes (`_reaper.py`).

Reaching the proxy works as for `e2b` (see that module): the sandbox is a cloud job, so pass
`HFSandboxBackend(proxy_public_url=...)`; the env gives the harness `sandbox.proxy_url(url)`.
(`Sandbox.proxy_url_for` is the other direction: a public URL for a server *inside* the
sandbox.) The layout, command wrapper and marker kill are shared with `e2b` (`_remote.py`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._reaper import DEFAULT_STOP_DELAYS_S
from ._remote import RemoteJob, RemoteShellBackend, RemoteShellSandbox
from ._remote_shell import KILLED_EXIT_CODE
from .base import TIMEOUT_EXIT_CODE, ExecResult, SandboxError, SandboxSpec

NEEDED_VERSION = "huggingface_hub>=2.4"
# A job in one of these stages runs no more (huggingface_hub 2.4, `_sandbox._TERMINAL_STAGES`).
TERMINAL_STAGES = ("COMPLETED", "ERROR", "DELETED", "CANCELED")


class HFJob(RemoteJob):
    """A background `SandboxProcess`. The SDK gives no output and no wait for one: output goes
    to files the wrapper writes, its exit code to one more, and `wait` polls `processes()`."""

    def __init__(self, sandbox: HFSandbox, process: Any, job_id: str, out: str) -> None:
        super().__init__(sandbox, job_id, out)
        self._process = process

    def poll(self) -> int | None:
        if self._code is not None or self._sandbox._closed:
            return self._code if self._code is not None else -9
        with self._sandbox._sdk_call(f"follow background job {self.id}"):
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
        written = self._written_exit_code()
        if written is not None:
            return written
        if process is not None and process.exit_code is not None:
            return process.exit_code
        return KILLED_EXIT_CODE  # gone without writing its code: killed

    def _await_exit(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.02
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, 0.5)  # each poll is an HTTP round-trip
        return True

    def _kill_process(self) -> None:
        from huggingface_hub.errors import SandboxError as HubSandboxError

        with contextlib.suppress(HubSandboxError):  # gone already; a dead job shows below
            self._process.kill()

    def kill(self) -> None:
        super().kill()
        if self._code is None and not self._sandbox._closed:
            self._code = self._exit_code(None)


class HFSandbox(RemoteShellSandbox):
    backend_name = "hf"
    _backend: HFSandboxBackend
    _stop_tries = 0

    @property
    def remote_id(self) -> str:
        return str(self.sdk.id)

    def _run_script(
        self, script: str, env: Mapping[str, str], cwd: str | None, timeout: float | None
    ) -> ExecResult:
        started = time.monotonic()
        with self._sdk_call("run a command"):
            result = self.sdk.run(
                ["bash", "-c", script],
                shell=False,
                env=dict(env) or None,
                cwd=cwd,
                timeout=timeout,
                check=False,  # a non-zero exit is a result, not an error
            )
        if result.timed_out:
            return ExecResult(TIMEOUT_EXIT_CODE, result.stdout, result.stderr, timed_out=True)
        code = result.exit_code
        if code is None:
            code = -(result.signal or 9)
        return ExecResult(code, result.stdout, result.stderr, duration_s=time.monotonic() - started)

    def _start_job(
        self, script: str, env: Mapping[str, str], cwd: str, job_id: str, out: str
    ) -> HFJob:
        process = self.sdk.run(
            ["bash", "-c", script], shell=False, env=dict(env), cwd=cwd, background=True
        )
        return HFJob(self, process, job_id, out)

    def _get(self, path: str) -> bytes:
        with self._sdk_call(f"read {path}"):
            return bytes(self.sdk.files.read(path))

    def _stop_once(self) -> bool:
        first = self._stop_tries == 0
        self._stop_tries += 1
        if first:
            self.sdk.kill()  # cancels the job and closes the client; a failed cancel only logs
        elif not self._backend.job_stopped(self.remote_id):
            self._backend.cancel_job(self.remote_id)
        if not self._backend.job_stopped(self.remote_id):
            return False
        self.sdk.close()  # the HTTP client (kill() closes it only when its own cancel worked)
        return True


class HFSandboxBackend(RemoteShellBackend):
    """Sandboxes as Hugging Face Jobs (one dedicated job each).

    A code block, not a doctest (it needs a Hugging Face token)::

        backend = HFSandboxBackend(image="python:3.12",
                                   proxy_public_url="https://proxy.example.com")

    `image` needs bash, tar and the harness CLIs (`SandboxSpec.image` overrides it per
    rollout). `namespace` is the user or org the jobs run under (default: the token's user).
    `sandbox_factory` replaces `huggingface_hub.Sandbox.create` and `jobs_api` the `HfApi` that
    checks and cancels jobs (tests pass fakes); `stop_delays_s` are the pauses between tries to
    stop a job.
    """

    name = "hf"
    sandbox_class = HFSandbox
    how_to_stop = "hf jobs cancel {id}"

    def __init__(
        self,
        *,
        image: str = "python:3.12",
        flavor: str = "cpu-basic",
        idle_timeout: float | str | None = 600,
        token: str | None = None,
        namespace: str | None = None,
        proxy_public_url: str | None = None,
        env: Mapping[str, str] | None = None,
        sandbox_factory: Callable[..., Any] | None = None,
        jobs_api: Any | None = None,
        stop_delays_s: Sequence[float] = DEFAULT_STOP_DELAYS_S,
    ) -> None:
        super().__init__(
            proxy_public_url=proxy_public_url,
            sandbox_factory=sandbox_factory,
            stop_delays_s=stop_delays_s,
        )
        self.image = image
        self.flavor = flavor
        self.idle_timeout = idle_timeout
        self.token = token
        self.namespace = namespace
        self.env = dict(env or {})
        self._jobs_api = jobs_api
        self._jobs_namespace = namespace
        self._jobs_lock = threading.Lock()

    def _sdk_create(self, spec: SandboxSpec) -> tuple[Callable[..., Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "image": spec.image or self.image,
            "flavor": self.flavor,
            "idle_timeout": self.idle_timeout,
            "env": self.env or None,
        }
        if self.namespace is not None:
            kwargs["namespace"] = self.namespace
        if self._factory is not None:
            if self.token is not None:
                kwargs["token"] = self.token
            return self._factory, kwargs
        token = self._token()
        from huggingface_hub import Sandbox as SdkSandbox

        return SdkSandbox.create, {**kwargs, "token": token}

    def _token(self) -> str:
        try:
            from huggingface_hub import Sandbox, get_token  # noqa: F401  (Sandbox: 2.4 or newer)
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
        return token

    def _create_error(self, exc: Exception) -> SandboxError:
        return SandboxError(
            f"could not create an hf sandbox: {exc} (is HF_TOKEN set and allowed to run Jobs?)"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_jobs_lock"}  # Ray pickles it

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _jobs_lock=threading.Lock())

    # -- the Jobs API, for a stop that is checked ------------------------------------------

    def _jobs(self) -> tuple[Any, str]:
        """The `HfApi` and the namespace the jobs run in (asked once: whoami is rate-limited)."""
        with self._jobs_lock:
            if self._jobs_api is None:
                from huggingface_hub import HfApi

                self._jobs_api = HfApi(token=self._token())
            if self._jobs_namespace is None:
                self._jobs_namespace = self._jobs_api.whoami(cache=True)["name"]
            return self._jobs_api, self._jobs_namespace

    def job_stopped(self, job_id: str) -> bool:
        """Whether the Hub says job `job_id` runs no more."""
        from huggingface_hub.errors import HfHubHTTPError

        api, namespace = self._jobs()
        try:
            stage = api.inspect_job(job_id=job_id, namespace=namespace).status.stage
        except HfHubHTTPError as exc:
            response = getattr(exc, "response", None)
            if response is not None and response.status_code == 404:  # no such job any more
                return True
            raise
        return stage in TERMINAL_STAGES

    def cancel_job(self, job_id: str) -> None:
        api, namespace = self._jobs()
        api.cancel_job(job_id=job_id, namespace=namespace)
