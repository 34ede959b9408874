"""The `e2b` sandbox: one E2B cloud microVM per rollout, driven through the `e2b` SDK.

Install with `pip install harness-gym[e2b]` and set `E2B_API_KEY`. Written against e2b 2.63
(`e2b/sandbox_sync/main.py`, `commands/command.py`, `commands/command_handle.py`,
`filesystem/filesystem.py`).

Reaching the proxy. The harness runs in E2B's cloud, so the proxy on this host's loopback is out
of its reach. Expose the proxy at a public URL (a tunnel, or a host with a public address and
`harness-gym serve --host 0.0.0.0`) and pass it as `E2BSandboxBackend(proxy_public_url=...)`;
the env then gives the harness `sandbox.proxy_url(proxy.url)`: that public URL with the proxy's
path, instead of the loopback URL.

Layout inside the VM (under one `mktemp -d` dir; the VM itself dies at `close()`)::

    work/  the task repo, uploaded as one tar   (Sandbox.workdir)
    home/  an empty HOME                         (Sandbox.home)
    tmp/   TMPDIR
    logs/  stdin, stdout and stderr files of commands

The remote-shell machinery shared with the `hf` backend lives in `_remote.py`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
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


class E2BJob(Job):
    """A background command: an SDK `CommandHandle` waited on by a thread, so that `poll()`
    and `wait(timeout)` need no polling round-trips."""

    def __init__(
        self, sandbox: E2BSandbox, handle: Any, job_id: str, out: str, err: str
    ) -> None:
        self._sandbox = sandbox
        self._handle = handle
        self.id = job_id
        self.stdout_path, self.stderr_path = out, err
        self._started = time.monotonic()
        self._code: int | None = None
        self._killed = False
        self._timed_out = False
        self._waiter = threading.Thread(target=self._wait_handle, daemon=True)
        self._waiter.start()

    def _wait_handle(self) -> None:
        from e2b import CommandExitException, SandboxException

        try:
            self._code = self._handle.wait().exit_code
        except CommandExitException as exc:
            self._code = exc.exit_code
        except SandboxException:  # stream lost (sandbox killed, network): gone for us
            self._code = -1
        finally:
            if (
                self._code is None
            ):  # anything else: still never report "running" forever
                self._code = -1

    def poll(self) -> int | None:
        if self._waiter.is_alive():
            return -9 if self._killed else None
        return self._code

    def wait(self, timeout: float | None = None) -> ExecResult:
        self._waiter.join(timeout)
        if self._waiter.is_alive():
            self._timed_out = True
            self.kill()
        code = TIMEOUT_EXIT_CODE if self._timed_out else self.poll()
        return ExecResult(
            exit_code=KILLED_EXIT_CODE if code is None else code,
            stdout=self._sandbox._read_text(self.stdout_path),
            stderr=self._sandbox._read_text(self.stderr_path),
            timed_out=self._timed_out,
            duration_s=time.monotonic() - self._started,
        )

    def kill(self) -> None:
        if self._sandbox._closed:
            return
        if self._waiter.is_alive():
            self._killed = True
            from e2b import SandboxException

            with contextlib.suppress(SandboxException):  # already gone
                self._handle.kill()
        self._sandbox.kill_job(self.id)
        self._waiter.join(5)

    def forget(self) -> None:
        self._killed = True


class E2BSandbox(RemoteShellSandbox):
    backend_name = "e2b"

    def __init__(self, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self.sdk = sdk_sandbox  # the e2b.Sandbox, for what the seam does not cover
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
        from e2b import CommandExitException, TimeoutException

        # The SDK runs `bash -l -c`: /etc/profile resets PATH, so a PATH the caller set is
        # put back inside the script.
        if "PATH" in env:
            script = f"export PATH={shlex.quote(env['PATH'])}; {script}"
        started = time.monotonic()
        try:
            result = self.sdk.commands.run(
                script,
                envs=dict(env),
                cwd=cwd,
                timeout=timeout or 0,  # the SDK's default is 60 s; 0 means no limit
            )
            code, stdout, stderr = result.exit_code, result.stdout, result.stderr
        except CommandExitException as exc:  # the SDK raises on any non-zero exit
            code, stdout, stderr = exc.exit_code, exc.stdout, exc.stderr
        except TimeoutException:
            return ExecResult(TIMEOUT_EXIT_CODE, "", "", timed_out=True)
        except Exception as exc:
            raise SandboxError(
                f"e2b sandbox {self.id}: command failed to run: {exc}"
            ) from exc
        return ExecResult(
            code, stdout or "", stderr or "", duration_s=time.monotonic() - started
        )

    def start(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdout_path: str | None = None,
    ) -> E2BJob:
        """Start in the background. stdout goes to `stdout_path` (default: a file under the
        sandbox's logs/), stderr to the same path plus `.stderr`, as in the local backend."""
        self._check_open()
        job_id = uuid.uuid4().hex
        out = self.path(stdout_path) if stdout_path else self._log_path("out")
        err = out + ".stderr"
        envs = self._command_env(env, job_id)
        script = job_script(command, out, err)
        if "PATH" in envs:
            script = f"export PATH={shlex.quote(envs['PATH'])}; {script}"
        try:
            handle = self.sdk.commands.run(
                script, background=True, envs=envs, cwd=self._cwd(cwd), timeout=0
            )
        except Exception as exc:
            raise SandboxError(
                f"could not start {command!r} in e2b sandbox {self.id}: {exc}"
            ) from exc
        job = E2BJob(self, handle, job_id, out, err)
        with self._lock:
            self._jobs.append(job)
        return job

    def _put(self, path: str, data: bytes) -> None:
        try:
            self.sdk.files.write(path, data)
        except Exception as exc:
            raise SandboxError(
                f"could not write {path} in e2b sandbox {self.id}: {exc}"
            ) from exc

    def _get(self, path: str) -> bytes:
        try:
            return bytes(self.sdk.files.read(path, format="bytes"))
        except Exception as exc:
            raise SandboxError(
                f"could not read {path} in e2b sandbox {self.id}: {exc}"
            ) from exc

    def _destroy(self) -> None:
        from e2b import SandboxException

        with contextlib.suppress(
            SandboxException
        ):  # gone already (its own timeout): fine
            self.sdk.kill()


class E2BSandboxBackend(SandboxBackend):
    """Sandboxes as E2B microVMs.

    >>> backend = E2BSandboxBackend(template="my-harness-template",
    ...                             proxy_public_url="https://proxy.example.com")  # doctest: +SKIP

    `template` is an E2B template with the harness CLIs installed (`SandboxSpec.image` overrides
    it per rollout); `timeout_s` is the VM's lifetime, a backstop for a process that dies
    without closing it. `sandbox_factory` replaces `e2b.Sandbox.create` (tests pass a fake).
    """

    name = "e2b"

    def __init__(
        self,
        *,
        template: str | None = None,
        timeout_s: int = 3600,
        api_key: str | None = None,
        proxy_public_url: str | None = None,
        envs: Mapping[str, str] | None = None,
        sandbox_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.template = template
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.proxy_public_url = proxy_public_url
        self.envs = dict(envs or {})
        self._factory = sandbox_factory

    def _sdk_factory(self) -> tuple[Callable[..., Any], str | None]:
        if self._factory is not None:
            return self._factory, self.api_key
        api_key = self.api_key or os.environ.get("E2B_API_KEY")
        if not api_key:
            # The SDK would say the same (AuthenticationException), but only after building a
            # client; this names the variable before anything else happens.
            raise SandboxError(
                "the e2b sandbox needs an E2B API key: set E2B_API_KEY or pass"
                " E2BSandboxBackend(api_key=...)"
            )
        try:
            from e2b import Sandbox as SdkSandbox
        except ImportError as exc:
            raise SandboxError(
                "the e2b sandbox needs the e2b SDK: pip install 'harness-gym[e2b]'"
            ) from exc
        return SdkSandbox.create, api_key

    def create(self, spec: SandboxSpec) -> E2BSandbox:
        factory, api_key = self._sdk_factory()
        kwargs: dict[str, Any] = {
            "template": spec.image or self.template,
            "timeout": self.timeout_s,
            "envs": self.envs,
        }
        if api_key is not None:
            kwargs["api_key"] = api_key
        try:
            sdk_sandbox = factory(**kwargs)
        except Exception as exc:
            if type(exc).__name__ == "AuthenticationException":
                raise SandboxError(
                    f"e2b refused the API key ({exc}): set E2B_API_KEY to a valid key"
                ) from exc
            raise SandboxError(f"could not create an e2b sandbox: {exc}") from exc
        sandbox = E2BSandbox(sdk_sandbox, spec)
        sandbox.proxy_public_url = self.proxy_public_url
        return sandbox
