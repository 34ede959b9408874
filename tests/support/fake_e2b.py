"""A stand-in for the e2b SDK's `Sandbox`, running its commands on this host in a temp dir.

It keeps to the SDK's surface as e2b 2.63 defines it, method and argument names and return
shapes taken from the installed source: `Sandbox.create(template=, timeout=, envs=, api_key=)`
(`e2b/sandbox_sync/main.py`); `commands.run(cmd, background=, envs=, user=, cwd=, on_stdout=,
on_stderr=, stdin=, timeout=60, request_timeout=)` returning a `CommandResult`, raising
`CommandExitException` on a non-zero exit and `TimeoutException` when `timeout` (seconds, 0 =
none) runs out, or a `CommandHandle` with `pid`, `wait()`, `kill()` when `background=True`
(`commands/command.py`, `commands/command_handle.py`); every command is `/bin/bash -l -c cmd`,
as the SDK sends it; `files.write(path, data)` and `files.read(path, format="text"|"bytes")`,
raising `FileNotFoundException` (`filesystem/filesystem.py`); `kill()`. The exception and
result types are the SDK's own.

What it cannot be is the VM: the "VM's filesystem" is the host's (absolute paths are host
paths; `/tmp` of the VM is `TMPDIR`, a dir of the fake's own) and its processes are host
processes. `kill()` kills every process the fake started, found by a marker variable, and
removes its dir, as destroying the VM would. Where the real envd's behaviour is not known from
the SDK source, the fake takes the harsher reading: a command timeout leaves the process
running, and a command's output pipes are read to EOF (so a `cmd &` keeps `run` waiting).
Every call is recorded in `calls` so tests can check what the backend asked for.
"""

from __future__ import annotations

import codecs
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from e2b import CommandExitException, CommandResult, TimeoutException
from e2b.exceptions import FileNotFoundException, SandboxException

from harness_gym.sandbox._processes import kill_marked

FAKE_MARKER = "FAKE_E2B_SANDBOX_ID"


class CommandHandle:
    def __init__(self, proc: subprocess.Popen[bytes], timeout: float | None) -> None:
        self._proc = proc
        self._timeout = timeout or None  # 0 means no limit, as in the SDK
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._readers = [
            threading.Thread(
                target=self._read, args=(proc.stdout, self._stdout), daemon=True
            ),
            threading.Thread(
                target=self._read, args=(proc.stderr, self._stderr), daemon=True
            ),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @staticmethod
    def _read(pipe: Any, chunks: list[str]) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for chunk in iter(lambda: pipe.read1(65536), b""):
            chunks.append(decoder.decode(chunk))
        chunks.append(decoder.decode(b"", final=True))

    def wait(
        self, on_pty: Any = None, on_stdout: Any = None, on_stderr: Any = None
    ) -> CommandResult:
        for reader in self._readers:
            reader.join(self._timeout)
            if reader.is_alive():
                raise TimeoutException("context deadline exceeded")
        try:
            code = self._proc.wait(self._timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutException("context deadline exceeded") from None
        stdout, stderr = "".join(self._stdout), "".join(self._stderr)
        exit_code = code if code >= 0 else -1  # Go's ExitCode() for a signal death
        if exit_code != 0:
            raise CommandExitException(
                stdout=stdout,
                stderr=stderr,
                exit_code=exit_code,
                error=f"exit status {exit_code}",
            )
        return CommandResult(stdout=stdout, stderr=stderr, exit_code=0, error=None)

    def kill(self) -> bool:
        """SIGKILL the command's process (its pid only, as the SDK's `send_signal` does)."""
        if self._proc.poll() is not None:
            return False
        try:
            os.kill(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True


@dataclass
class Commands:
    sandbox: Sandbox
    handles: dict[int, CommandHandle] = field(default_factory=dict)

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
        if box.killed:
            raise SandboxException("sandbox was killed")
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
        handle = CommandHandle(proc, timeout)
        self.handles[proc.pid] = handle
        return (
            handle
            if background
            else handle.wait(on_stdout=on_stdout, on_stderr=on_stderr)
        )

    def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        handle = self.handles.get(pid)
        return handle.kill() if handle else False


@dataclass
class Filesystem:
    sandbox: Sandbox

    def write(
        self, path: str, data: str | bytes, user: str | None = None, **_: Any
    ) -> None:
        self.sandbox.calls.append(("files.write", {"path": path, "size": len(data)}))
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    def read(
        self, path: str, format: str = "text", user: str | None = None, **_: Any
    ) -> Any:
        self.sandbox.calls.append(("files.read", {"path": path, "format": format}))
        try:
            data = Path(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise FileNotFoundException(f"path '{path}' does not exist") from None
        return bytearray(data) if format == "bytes" else data.decode()


class Sandbox:
    """`e2b.Sandbox`'s surface over a temp dir and host processes."""

    created: ClassVar[list[Sandbox]] = []  # every fake made, so tests can look inside

    def __init__(
        self, template: str | None, timeout: int | None, envs: dict[str, str] | None
    ) -> None:
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
        self.killed = False
        self.commands = Commands(self)
        self.files = Filesystem(self)

    @classmethod
    def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,
        envs: dict[str, str] | None = None,
        api_key: str | None = None,
        **opts: Any,
    ) -> Sandbox:
        box = cls(template, timeout, envs)
        box.calls.append(
            (
                "create",
                {
                    "template": template,
                    "timeout": timeout,
                    "envs": envs,
                    "api_key": api_key,
                },
            )
        )
        cls.created.append(box)
        return box

    def kill(self, request_timeout: float | None = None) -> bool:
        self.calls.append(("kill", {}))
        if self.killed:
            return False
        self.killed = True
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
