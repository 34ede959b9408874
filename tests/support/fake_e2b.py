"""A stand-in for the e2b SDK's `Sandbox`, running its commands on this host in a temp dir.

It keeps to the SDK's surface as e2b 2.63 defines it, method and argument names and return
types taken from the installed source (tests/test_sdk_contract.py checks every call against
it): `Sandbox.create(template=, timeout=, envs=, api_key=)` (`e2b/sandbox_sync/main.py`);
`commands.run(cmd, background=, envs=, user=, cwd=, on_stdout=, on_stderr=, stdin=, timeout=60,
request_timeout=)` returning a `CommandResult`, raising `CommandExitException` on a non-zero exit,
or a `CommandHandle` (`pid`, `wait()`, `kill()`) when `background=True`; `commands.connect(pid,
timeout=60)` (`commands/command.py`, `commands/command_handle.py`); every command is
`/bin/bash -l -c cmd`, as the SDK sends it; `files.write(path, data) -> WriteInfo` and
`files.read(path, format="text"|"bytes")` (`filesystem/filesystem.py`); `is_running()`;
`kill() -> bool` (False: not found).

Errors are the SDK's own: an envd failure is built as the `connectrpc.ConnectError` the SDK would
receive and mapped by the SDK's own `e2b.envd.rpc.handle_rpc_exception` (a file error by
`e2b.envd.api.format_envd_api_exception`), so the classes and their `issubclass` relations are
the installed SDK's: a dead VM is `SandboxNotRunningException`, a dropped stream with the VM
alive `SandboxUnreachableException`, the command's deadline or a cancelled call a plain
`TimeoutException`. The messages are shaped like the real proxy's; their exact wording is not
known from the SDK source. An unknown template is the API's 404 (`api_exception_from_code`).

What it cannot be is the VM: the "VM's filesystem" is the host's (absolute paths are host
paths; `/tmp` of the VM is `TMPDIR`, a dir of the fake's own) and its processes are host
processes. A VM ends at `kill()` or when its `timeout` (its lifetime, in seconds, as in E2B)
passes: every process the fake started is killed, found by a marker variable, and its dir is
removed. Where the real envd's behaviour is not known from the SDK source, the fake takes the
harsher reading: a command timeout leaves the process running, and a command's output pipes
are read to EOF (so a `cmd &` keeps `run` waiting). Every call is recorded in `calls`.
"""

from __future__ import annotations

import codecs
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b import CommandExitException, CommandResult, FileNotFoundException
from e2b.api import api_exception_from_code
from e2b.envd.api import format_envd_api_exception
from e2b.envd.rpc import handle_rpc_exception
from e2b.sandbox.filesystem.filesystem import FileType, WriteInfo

from harness_gym.sandbox._processes import kill_marked

FAKE_MARKER = "FAKE_E2B_SANDBOX_ID"
DEFAULT_LIFETIME_S = 300  # the API's default sandbox timeout


def rpc_error(code: Code, message: str, sandbox_running: bool | None = None) -> Exception:
    """What the SDK raises for an envd call that failed with `code`, by the SDK's own mapping
    (`sandbox_running`: what its health probe found, for a dropped connection)."""
    return handle_rpc_exception(ConnectError(code, message), sandbox_running=sandbox_running)


def vm_gone(box: Sandbox) -> Exception:
    """A request to a VM that is gone: the proxy answers 502 "... was not found"."""
    return rpc_error(Code.UNAVAILABLE, f"The sandbox {box.sandbox_id} was not found")


def stream_broken(box: Sandbox, vm_alive: bool) -> Exception:
    """A command's stream that ended before the command did; the SDK then probes the VM."""
    message = f"the connection to sandbox {box.sandbox_id} ended before the stream completed"
    return rpc_error(Code.UNAVAILABLE, message, sandbox_running=vm_alive)


class _Process:
    """One command's process and its output, read to EOF by two threads."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, self.stderr), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(pipe: Any, chunks: list[str]) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for chunk in iter(lambda: pipe.read1(65536), b""):
            chunks.append(decoder.decode(chunk))
        chunks.append(decoder.decode(b"", final=True))

    def ended(self) -> bool:
        return self.proc.poll() is not None and not any(r.is_alive() for r in self.readers)


class CommandHandle:
    """A stream of one command's events, bounded by `timeout` from when it was opened."""

    def __init__(self, box: Sandbox, process: _Process, timeout: float | None) -> None:
        self._box = box
        self._process = process
        self._deadline = time.monotonic() + timeout if timeout else None  # 0: no limit
        self.broken: Exception | None = None  # set to end the stream with this error
        box.open_handles.append(self)

    @property
    def pid(self) -> int:
        return self._process.proc.pid

    def wait(
        self, on_pty: Any = None, on_stdout: Any = None, on_stderr: Any = None
    ) -> CommandResult:
        try:
            while not self._process.ended():
                if self._box.gone:
                    raise stream_broken(self._box, vm_alive=False)
                if self.broken is not None:
                    raise self.broken
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    raise rpc_error(Code.DEADLINE_EXCEEDED, "context deadline exceeded")
                time.sleep(0.01)
        finally:
            if self in self._box.open_handles:
                self._box.open_handles.remove(self)
        if self._box.gone:  # killed with its VM: the stream broke, no end event came
            raise stream_broken(self._box, vm_alive=False)
        stdout, stderr = "".join(self._process.stdout), "".join(self._process.stderr)
        code = self._process.proc.returncode
        exit_code = code if code >= 0 else -1  # Go's ExitCode() for a signal death
        if exit_code != 0:
            raise CommandExitException(
                stdout=stdout, stderr=stderr, exit_code=exit_code, error=f"exit status {exit_code}"
            )
        return CommandResult(stdout=stdout, stderr=stderr, exit_code=0, error=None)

    def kill(self) -> bool:
        return self._box.commands.kill(self.pid)


@dataclass
class Commands:
    sandbox: Sandbox
    processes: dict[int, _Process] = field(default_factory=dict)
    next_run_error: Exception | None = None  # raised by the next `run`, e.g. a cancel

    def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Any = None,
        on_stderr: Any = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> Any:
        box = self.sandbox
        box.calls.append(
            (
                "commands.run",
                {
                    "cmd": cmd,
                    "background": background,
                    "envs": envs,
                    "cwd": cwd,
                    "timeout": timeout,
                },
            )
        )
        if box.gone:
            raise vm_gone(box)
        if self.next_run_error is not None:
            error, self.next_run_error = self.next_run_error, None
            raise error
        proc = subprocess.Popen(
            ["/bin/bash", "-l", "-c", cmd],
            cwd=cwd or box.user_home,
            env={**box.vm_env, **(envs or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        box.procs.append(proc)
        self.processes[proc.pid] = _Process(proc)
        handle = CommandHandle(box, self.processes[proc.pid], timeout)
        return handle if background else handle.wait(on_stdout=on_stdout, on_stderr=on_stderr)

    def connect(
        self,
        pid: int,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> CommandHandle:
        box = self.sandbox
        box.calls.append(("commands.connect", {"pid": pid, "timeout": timeout}))
        if box.gone:
            raise vm_gone(box)
        process = self.processes.get(pid)
        if process is None or process.ended():  # envd keeps no ended process
            raise rpc_error(Code.NOT_FOUND, f"process with pid {pid} not found")
        return CommandHandle(box, process, timeout)

    def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        """SIGKILL the command's process (its pid only, as envd's `send_signal` does)."""
        if self.sandbox.gone:
            raise vm_gone(self.sandbox)
        process = self.processes.get(pid)
        if process is None or process.proc.poll() is not None:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True


@dataclass
class Filesystem:
    sandbox: Sandbox

    def _check_vm(self) -> None:
        if self.sandbox.gone:
            message = f"The sandbox {self.sandbox.sandbox_id} was not found"
            raise format_envd_api_exception(502, message)

    def write(self, path: str, data: str | bytes, user: str | None = None, **_: Any) -> WriteInfo:
        self.sandbox.calls.append(("files.write", {"path": path, "size": len(data)}))
        self._check_vm()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        return WriteInfo(name=target.name, type=FileType.FILE, path=path)

    def read(self, path: str, format: str = "text", user: str | None = None, **_: Any) -> Any:
        self.sandbox.calls.append(("files.read", {"path": path, "format": format}))
        self._check_vm()
        try:
            data = Path(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise FileNotFoundException(f"path '{path}' does not exist") from None
        return bytearray(data) if format == "bytes" else data.decode()


class Sandbox:
    """`e2b.Sandbox`'s surface over a temp dir and host processes."""

    created: ClassVar[list[Sandbox]] = []  # every fake made, so tests can look inside
    templates: ClassVar[set[str]] = {"base"}  # the templates that "exist" in the E2B team
    kill_failures: ClassVar[int] = 0  # the next N kills fail (the API answers 500)

    def __init__(self, template: str, timeout: int | None, envs: dict[str, str] | None) -> None:
        self.sandbox_id = f"fake-{uuid.uuid4().hex[:12]}"
        self.template, self.timeout = template, timeout
        self.root = Path(tempfile.mkdtemp(prefix="fake-e2b-"))
        self.user_home = str(self.root / "home" / "user")
        os.makedirs(self.user_home)
        os.makedirs(self.root / "tmp")
        self.vm_env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.user_home,
            "USER": "user",
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.root / "tmp"),  # the VM's /tmp
            **(envs or {}),
            FAKE_MARKER: self.sandbox_id,
        }
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.open_handles: list[CommandHandle] = []
        self.gone = False
        self._end_lock = threading.Lock()
        self.commands = Commands(self)
        self.files = Filesystem(self)
        self._lifetime = threading.Timer(timeout or DEFAULT_LIFETIME_S, self.end)
        self._lifetime.daemon = True
        self._lifetime.start()

    @classmethod
    def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,
        envs: dict[str, str] | None = None,
        api_key: str | None = None,
        **opts: Any,
    ) -> Sandbox:
        if (template or "base") not in cls.templates:
            raise api_exception_from_code(404, f"template '{template}' not found")
        box = cls(template or "base", timeout, envs)
        box.calls.append(
            ("create", {"template": template, "timeout": timeout, "envs": envs, "api_key": api_key})
        )
        cls.created.append(box)
        return box

    def is_running(self, request_timeout: float | None = None) -> bool:
        return not self.gone

    def break_streams(self) -> None:
        """Every open command stream ends without the command's exit, the VM alive (a load
        balancer dropping a long connection)."""
        for handle in list(self.open_handles):
            handle.broken = stream_broken(self, vm_alive=True)

    def end(self) -> bool:
        """The VM ends (killed, or its lifetime passed): its processes and files go with it."""
        with self._end_lock:
            if self.gone:
                return False
            self.gone = True
        self._lifetime.cancel()
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_marked(FAKE_MARKER, self.sandbox_id)
        for proc in self.procs:
            proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
        return True

    def kill(self, **opts: Any) -> bool:
        self.calls.append(("kill", {}))
        if Sandbox.kill_failures > 0:
            Sandbox.kill_failures -= 1
            raise api_exception_from_code(500, "internal error while killing the sandbox")
        return self.end()  # False: not found, as the API's 404
