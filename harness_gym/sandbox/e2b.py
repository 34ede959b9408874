"""The `e2b` sandbox: one E2B cloud microVM per rollout, driven through the `e2b` SDK.

Install with `pip install harness-gym[e2b]` and set `E2B_API_KEY`. Written against e2b 2.63
(`e2b/sandbox_sync/main.py`, `sandbox_sync/commands/command.py`, `command_handle.py`,
`envd/rpc.py`, `exceptions.py`; the facts used are listed in docs/design.md).

Reaching the proxy. The harness runs in E2B's cloud, so the proxy on this host's loopback is out
of its reach. Expose the proxy at a public URL (a tunnel, or a host with a public address and
`harness-gym serve --host 0.0.0.0`) and pass it as `E2BSandboxBackend(proxy_public_url=...)`;
the env then gives the harness `sandbox.proxy_url(proxy.url)`: that public URL with the proxy's
path, instead of the loopback URL.

Templates. E2B starts VMs from its own templates, not from Docker images: a task's `image_name`
runs only where `templates=` maps it to a template built from that image; otherwise `create`
says so (a VM without the task's dependencies would grade the agent in the wrong environment).

A dead VM. e2b 2.63 raises `SandboxNotRunningException` (killed, or past its timeout) and
`SandboxUnreachableException` as subclasses of `TimeoutException`, and maps a cancelled call to
`TimeoutException` too. Only a `TimeoutException` that arrives when the command's own timeout
has run out is a timeout here; everything else is a `SandboxError` (the episode: `infra_error`).

Layout inside the VM, and the command wrapper: `_remote.py`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._reaper import DEFAULT_STOP_DELAYS_S
from ._remote import RemoteJob, RemoteShellBackend, RemoteShellSandbox
from ._remote_shell import KILLED_EXIT_CODE
from .base import TIMEOUT_EXIT_CODE, ExecResult, SandboxError, SandboxSpec

STREAM_RECONNECTS = 3  # a background command's stream may drop while its VM runs on
DEADLINE_SLACK_S = 0.05  # the SDK's deadline starts a little after our clock does


def _shell_command(script: str, env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The command and envs to hand the SDK, which runs `bash -l -c COMMAND`.

    A login shell sources the first of ~/.bash_profile, ~/.bash_login and ~/.profile when it
    starts and ~/.bash_logout when it `exit`s, and the agent can write all of them: a profile it
    planted would run before every later command, the grader's among them (and could wait for
    the grader's keys to appear, then forge its report). So the login shell gets a HOME that does
    not exist (a fresh name each time) and at once `exec`s a plain `bash --noprofile --norc` with
    the caller's HOME and PATH (/etc/profile resets PATH) put back: no file the agent wrote is
    read, and the login shell never reaches its logout."""
    envs = dict(env)
    home = envs.get("HOME")
    envs["HOME"] = f"/nonexistent/harness-gym-{secrets.token_hex(8)}"
    restore = [f"export HOME={shlex.quote(home)}" if home is not None else
               'export HOME="$(getent passwd "$(id -u)" | cut -d: -f6)"']
    if "PATH" in envs:
        restore.append(f"export PATH={shlex.quote(envs['PATH'])}")
    command = "; ".join(restore) + f"; exec /bin/bash --noprofile --norc -c {shlex.quote(script)}"
    return command, envs


class E2BJob(RemoteJob):
    """A background command: an SDK `CommandHandle` followed by a thread, so that `poll()` and
    `wait(timeout)` need no round-trips. A dropped stream is reconnected while the VM lives."""

    def __init__(self, sandbox: E2BSandbox, handle: Any, job_id: str, out: str) -> None:
        super().__init__(sandbox, job_id, out)
        self._e2b = sandbox
        self._handle = handle
        self._waiter = threading.Thread(target=self._follow, daemon=True, name=f"e2b-{job_id}")
        self._waiter.start()

    def _follow(self) -> None:
        from e2b import CommandExitException, NotFoundException, SandboxNotRunningException

        lost: Exception | None = None
        for _ in range(STREAM_RECONNECTS + 1):
            try:
                self._code = self._handle.wait().exit_code
                return
            except CommandExitException as exc:  # the SDK raises on any non-zero exit
                self._code = exc.exit_code
                return
            # The stream ended without the command's exit: the VM died (NotRunning), the
            # connection dropped (Unreachable, a cancel mapped to TimeoutException, a transport
            # error), or the SDK's bare "Command ended without an end event".
            except Exception as exc:
                lost = exc
            if self._killed:
                return
            if isinstance(lost, SandboxNotRunningException) or not self._e2b.vm_running():
                break
            try:
                self._handle = self._e2b.sdk.commands.connect(self._handle.pid, timeout=0)
            except NotFoundException:  # envd forgets an ended command: the wrapper wrote its code
                code = self._written_exit_code()
                self._code = KILLED_EXIT_CODE if code is None else code
                return
            except Exception as exc:
                lost = exc
                break
        self._lost = lost

    def _await_exit(self, timeout: float | None) -> bool:
        self._waiter.join(timeout)
        return not self._waiter.is_alive()

    def poll(self) -> int | None:
        if self._waiter.is_alive():
            return -9 if self._killed else None
        self._check_lost()
        return -9 if self._code is None else self._code  # None: we killed it, the stream broke

    def _kill_process(self) -> None:
        from e2b import SandboxException

        if self._waiter.is_alive():
            with contextlib.suppress(SandboxException):  # gone already; a dead VM shows below
                self._handle.kill()

    def kill(self) -> None:
        super().kill()
        self._waiter.join(5)


class E2BSandbox(RemoteShellSandbox):
    backend_name = "e2b"

    @property
    def remote_id(self) -> str:
        return str(self.sdk.sandbox_id)

    def vm_running(self) -> bool:
        """Whether the VM answers its health check (an error there: not for us any more)."""
        try:
            return bool(self.sdk.is_running())
        except Exception:
            return False

    def _sdk_error(self, what: str, exc: Exception) -> SandboxError:
        from e2b import SandboxNotRunningException, SandboxUnreachableException

        if isinstance(exc, SandboxNotRunningException):
            return SandboxError(
                f"e2b sandbox {self.remote_id} is not running any more (killed, or past its"
                f" timeout_s={self._backend.timeout_s}), so harness-gym could not {what}: {exc}"
            )
        if isinstance(exc, SandboxUnreachableException):
            return SandboxError(
                f"e2b sandbox {self.remote_id} cannot be reached (its network or envd is down,"
                f" or ours), so harness-gym could not {what}: {exc}"
            )
        return super()._sdk_error(what, exc)

    def _run_script(
        self, script: str, env: Mapping[str, str], cwd: str | None, timeout: float | None
    ) -> ExecResult:
        from e2b import (
            CommandExitException,
            SandboxNotRunningException,
            SandboxUnreachableException,
            TimeoutException,
        )

        started = time.monotonic()
        command, envs = _shell_command(script, env)
        try:
            result = self.sdk.commands.run(
                command,
                envs=envs,
                cwd=cwd,
                timeout=timeout or 0,  # the SDK's default is 60 s; 0 means no limit
            )
            code, stdout, stderr = result.exit_code, result.stdout, result.stderr
        except CommandExitException as exc:  # the SDK raises on any non-zero exit
            code, stdout, stderr = exc.exit_code, exc.stdout, exc.stderr
        except (SandboxNotRunningException, SandboxUnreachableException) as exc:
            raise self._sdk_error("run a command", exc) from exc
        except TimeoutException as exc:  # the command's deadline, or a cancelled call
            if timeout and time.monotonic() - started >= timeout - DEADLINE_SLACK_S:
                return ExecResult(TIMEOUT_EXIT_CODE, "", "", timed_out=True)
            raise self._sdk_error("run a command (cancelled before its timeout)", exc) from exc
        except Exception as exc:
            raise self._sdk_error("run a command", exc) from exc
        return ExecResult(code, stdout or "", stderr or "", duration_s=time.monotonic() - started)

    def _start_job(
        self, script: str, env: Mapping[str, str], cwd: str, job_id: str, out: str
    ) -> E2BJob:
        command, envs = _shell_command(script, env)
        handle = self.sdk.commands.run(command, background=True, envs=envs, cwd=cwd, timeout=0)
        return E2BJob(self, handle, job_id, out)

    def _get(self, path: str) -> bytes:
        with self._sdk_call(f"read {path}"):
            return bytes(self.sdk.files.read(path, format="bytes"))

    def _stop_once(self) -> bool:
        self.sdk.kill()  # True: killed; False: not found (gone already); raises on failure
        return True


class E2BSandboxBackend(RemoteShellBackend):
    """Sandboxes as E2B microVMs.

    A code block, not a doctest (it needs an E2B account)::

        backend = E2BSandboxBackend(template="my-harness-template",
                                    proxy_public_url="https://proxy.example.com")

    `template` is an E2B template with the harness CLIs installed, for tasks without an image
    (None: E2B's `base`); `templates` maps a task's Docker `image_name` to the E2B template built
    from it. `timeout_s` is the VM's lifetime, a backstop for a process that dies without
    closing it. `sandbox_factory` replaces `e2b.Sandbox.create` (tests pass a fake);
    `stop_delays_s` are the pauses between tries to kill a VM.
    """

    name = "e2b"
    sandbox_class = E2BSandbox
    how_to_stop = "e2b sandbox kill {id}"

    def __init__(
        self,
        *,
        template: str | None = None,
        templates: Mapping[str, str] | None = None,
        timeout_s: int = 3600,
        api_key: str | None = None,
        proxy_public_url: str | None = None,
        envs: Mapping[str, str] | None = None,
        sandbox_factory: Callable[..., Any] | None = None,
        stop_delays_s: Sequence[float] = DEFAULT_STOP_DELAYS_S,
    ) -> None:
        super().__init__(
            proxy_public_url=proxy_public_url,
            sandbox_factory=sandbox_factory,
            stop_delays_s=stop_delays_s,
        )
        self.template = template
        self.templates = dict(templates or {})
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.envs = dict(envs or {})

    def template_for(self, image: str | None) -> str | None:
        """The E2B template a rollout of a task with Docker image `image` starts from."""
        if image is None:
            return self.template
        if image in self.templates:
            return self.templates[image]
        raise SandboxError(
            f"the task's Docker image {image!r} has no E2B template: E2B starts VMs from its own"
            " templates, not from Docker images. Build a template from that image (e2b template"
            f" build) and map it: E2BSandboxBackend(templates={{{image!r}: 'your-template'}})"
        )

    def _sdk_create(self, spec: SandboxSpec) -> tuple[Callable[..., Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "template": self.template_for(spec.image),
            "timeout": self.timeout_s,
            "envs": self.envs,
        }
        if self._factory is not None:
            if self.api_key is not None:
                kwargs["api_key"] = self.api_key
            return self._factory, kwargs
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
        return SdkSandbox.create, {**kwargs, "api_key": api_key}

    def _create_error(self, exc: Exception) -> SandboxError:
        from e2b import AuthenticationException, SandboxException

        if isinstance(exc, AuthenticationException):
            return SandboxError(f"e2b refused the API key ({exc}): set E2B_API_KEY to a valid key")
        if isinstance(exc, SandboxException) and exc.status_code in (400, 404):
            return SandboxError(
                f"e2b could not create a sandbox ({exc}): does the template exist in your E2B"
                " team? Set template= (or templates= for tasks with a Docker image)"
            )
        return super()._create_error(exc)
