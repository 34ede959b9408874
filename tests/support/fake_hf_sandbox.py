"""A stand-in for `huggingface_hub.Sandbox`, running its commands on this host in a temp dir.

It keeps to the SDK's surface as huggingface_hub 2.4 defines it in `huggingface_hub/_sandbox.py`,
names and return shapes taken from that source: `Sandbox.create(image, *, flavor=, idle_timeout=,
env=, secrets=, namespace=, labels=, start_timeout=, token=)`; `run(cmd, *, shell=, env=, cwd=,
timeout=, stdin=, on_stdout=, on_stderr=, check=True, capture_output=True, background=False)`,
where a str runs under `/bin/sh -c` and a list is exec'd, `timeout` kills the whole process
group and sets `timed_out`, `check` raises `SandboxCommandError`, and `background=True` returns
a `SandboxProcess` (`id`, `pid`, `cmd`, `running`, `exit_code`, `kill()`) without output;
`processes()`; `files.read(path) -> bytes`, `files.write(path, data, mode=None)`,
`files.exists`, raising `SandboxError` with `status_code=404` for a missing file; `kill()` and
`close()`; `proxy_url_for(port, path)`. Results and errors are the SDK's own types
(tests/test_sdk_contract.py checks every call against the installed SDK).

`kill()` behaves as the real one: it cancels the job through the Hub, and when the cancel fails
it logs a warning and returns, leaving the job running (`Sandbox.cancel_failures` makes the
next cancels fail, as a Hub answering 500 would). `HfApi` is the slice of
`huggingface_hub.HfApi` that looks at and cancels jobs (`whoami`, `inspect_job` returning the
SDK's `JobInfo`, `cancel_job`), over the fake sandboxes. A job that ended (cancelled, or
`end()`) answers every request with the SDK's `SandboxError`; what status the real Jobs proxy
gives then is not known from the SDK source.

What it cannot be is the job's container: absolute paths are host paths (`/tmp` of the
container is `TMPDIR`, a dir of the fake's own), processes are host processes. `kill()` kills
everything the fake started, found by a marker variable, and removes its dir, as cancelling
the job would. Every call is recorded in `calls`.
"""

from __future__ import annotations

import codecs
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx2
from huggingface_hub import JobInfo
from huggingface_hub._sandbox import SandboxCommandResult
from huggingface_hub.errors import HfHubHTTPError, SandboxCommandError, SandboxError
from huggingface_hub.utils import logging

from harness_gym.sandbox._processes import kill_marked

FAKE_MARKER = "FAKE_HF_SANDBOX_ID"
USER = "fake-user"
logger = logging.get_logger("huggingface_hub._sandbox")  # where the real kill() logs


def hub_error(status: int, message: str, method: str, url: str) -> HfHubHTTPError:
    """The error `hf_raise_for_status` raises for a Hub answer with `status`."""
    response = httpx2.Response(status, request=httpx2.Request(method, url))
    return HfHubHTTPError(f"{status} Server Error: {message} for url: {url}", response=response)


@dataclass
class SandboxProcess:
    id: str | None
    pid: int
    cmd: str | list[str]
    _sandbox: Sandbox = field(repr=False, compare=False)
    tag: str | None = None
    started_at_ms: int | None = None
    running: bool = True
    exit_code: int | None = None

    def kill(self) -> bool:
        """Terminate the process group (a setsid descendant outlives it, as the SDK warns)."""
        return self._sandbox._kill_process(self.id)


class SandboxFiles:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def read(self, path: str) -> bytes:
        self._sandbox.calls.append(("files.read", {"path": path}))
        self._sandbox._check_job()
        try:
            return Path(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise SandboxError(
                f"Sandbox API error (404): no such file: {path}", status_code=404
            ) from None

    def write(self, path: str, data: str | bytes, mode: str | None = None) -> None:
        self._sandbox.calls.append(
            ("files.write", {"path": path, "size": len(data), "mode": mode})
        )
        self._sandbox._check_job()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    def exists(self, path: str) -> bool:
        return Path(path).exists()


class Sandbox:
    """`huggingface_hub.Sandbox`'s surface over a temp dir and host processes."""

    created: ClassVar[list[Sandbox]] = []
    cancel_failures: ClassVar[int] = 0  # the next N job cancels fail (the Hub answers 500)

    def __init__(self, image: str, env: dict[str, Any] | None) -> None:
        self.id = f"fake-job-{secrets.token_hex(6)}"
        self.image = image
        self.root = Path(tempfile.mkdtemp(prefix="fake-hf-"))
        os.makedirs(self.root / "root")
        os.makedirs(self.root / "tmp")
        self.container_env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.root / "root"),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.root / "tmp"),  # the container's /tmp
            **{k: str(v) for k, v in (env or {}).items()},
            FAKE_MARKER: self.id,
        }
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._procs: dict[str, tuple[subprocess.Popen[bytes], SandboxProcess]] = {}
        self._killed = False  # the SDK's flag: a kill() went through
        self.stage = "RUNNING"  # the job's stage, as the Hub reports it
        self._lock = threading.Lock()
        self.files = SandboxFiles(self)

    @classmethod
    def create(
        cls,
        image: str = "python:3.12",
        *,
        flavor: str = "cpu-basic",
        idle_timeout: float | str | None = 600,
        env: dict[str, Any] | None = None,
        secrets: dict[str, Any] | None = None,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
        start_timeout: float = 120.0,
        token: str | None = None,
        **_: Any,
    ) -> Sandbox:
        box = cls(image, env)
        box.calls.append(
            (
                "create",
                {
                    "image": image,
                    "flavor": flavor,
                    "idle_timeout": idle_timeout,
                    "env": env,
                    "namespace": namespace,
                    "token": token,
                },
            )
        )
        cls.created.append(box)
        return box

    # -- exec ------------------------------------------------------------------------------

    def _check_job(self) -> None:
        if self.stage != "RUNNING":
            raise SandboxError("Sandbox API error (404): sandbox is gone", status_code=404)

    def _spawn(
        self, cmd: str | list[str], shell: bool | None, env: Any, cwd: Any, **io: Any
    ) -> Any:
        self._check_job()
        if (
            shell is True
            and not isinstance(cmd, str)
            or shell is False
            and isinstance(cmd, str)
        ):
            raise ValueError("shell and the type of cmd disagree")
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.Popen(
            argv,
            cwd=cwd or self.container_env["HOME"],
            env={**self.container_env, **{k: str(v) for k, v in (env or {}).items()}},
            start_new_session=True,
            **io,
        )

    def run(
        self,
        cmd: str | list[str],
        *,
        shell: bool | None = None,
        env: dict[str, Any] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
        on_stdout: Any = None,
        on_stderr: Any = None,
        check: bool = True,
        capture_output: bool = True,
        background: bool = False,
    ) -> Any:
        self.calls.append(
            (
                "run",
                {
                    "cmd": cmd,
                    "shell": shell,
                    "env": env,
                    "cwd": cwd,
                    "timeout": timeout,
                    "check": check,
                    "background": background,
                },
            )
        )
        if background:
            proc = self._spawn(
                cmd,
                shell,
                env,
                cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            process_id = secrets.token_hex(8)
            process = SandboxProcess(
                id=process_id,
                pid=proc.pid,
                cmd=cmd,
                _sandbox=self,
                started_at_ms=int(time.time() * 1000),
            )
            with self._lock:
                self._procs[process_id] = (proc, process)
            return process
        started = time.monotonic()
        proc = self._spawn(
            cmd,
            shell,
            env,
            cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        timed_out = False
        try:
            out, err = proc.communicate(
                stdin.encode() if stdin else None, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # "kill the command (whole process group)"
            out, err = proc.communicate()
        if self.stage != "RUNNING":  # the job ended under it: the stream ends, no exit event
            raise SandboxError("connection lost while running command")
        code = proc.returncode
        result = SandboxCommandResult(
            exit_code=None if code < 0 else code,
            stdout=_decode(out),
            stderr=_decode(err),
            signal=-code if code < 0 else None,
            timed_out=timed_out,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
        if check and (result.exit_code != 0 or result.timed_out):
            raise SandboxCommandError(cmd=cmd, result=result)
        return result

    def processes(self) -> list[SandboxProcess]:
        self.calls.append(("processes", {}))
        self._check_job()
        listed = []
        with self._lock:
            for proc, process in self._procs.values():
                code = proc.poll()
                if code is not None:
                    process.running, process.exit_code = False, code
                listed.append(process)
        return listed

    def _kill_process(self, process_id: str | None) -> bool:
        self.calls.append(("process.kill", {"id": process_id}))
        self._check_job()
        proc, _ = self._procs[process_id or ""]
        if proc.poll() is not None:
            return False
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        proc.wait()
        return True

    # -- lifecycle -------------------------------------------------------------------------

    def kill(self) -> None:
        """As huggingface_hub 2.4's `Sandbox._kill`: a failed cancel is logged, not raised."""
        self.calls.append(("kill", {}))
        if self._killed:
            return
        try:
            self._cancel_job()
        except Exception as e:
            logger.warning(f"Failed to kill sandbox {self.id}: {e}")
            return
        self._killed = True

    def _cancel_job(self) -> None:
        """The Hub's job cancel: the job's processes and files go."""
        if Sandbox.cancel_failures > 0:
            Sandbox.cancel_failures -= 1
            url = f"https://huggingface.co/api/jobs/{USER}/{self.id}/cancel"
            raise hub_error(500, "Internal Server Error", "POST", url)
        self.end("CANCELED")

    def end(self, stage: str = "COMPLETED") -> None:
        """The job ends (cancelled, idle, crashed): its processes and files go with it."""
        with self._lock:
            if self.stage != "RUNNING":
                return
            self.stage = stage
        for proc, _ in list(self._procs.values()):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        kill_marked(FAKE_MARKER, self.id)
        shutil.rmtree(self.root, ignore_errors=True)

    def close(self) -> None:
        self.calls.append(("close", {}))

    def proxy_url_for(
        self, port: int | str, path: str = "/", *, scheme: str = "https://"
    ) -> str:
        path = path if path.startswith("/") else "/" + path
        return f"{scheme}{self.id}--49983.hf.jobs/v1/proxy/{port}{path}"


class HfApi:
    """The Jobs calls of `huggingface_hub.HfApi`, over the fake sandboxes."""

    def __init__(self, token: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def whoami(self, token: bool | str | None = None, *, cache: bool = False) -> dict:
        self.calls.append(("whoami", {"cache": cache}))
        return {"type": "user", "name": USER}

    @staticmethod
    def _job(job_id: str, method: str, url: str) -> Sandbox:
        for box in Sandbox.created:
            if box.id == job_id:
                return box
        raise hub_error(404, "Not Found", method, url)

    def inspect_job(
        self, *, job_id: str, namespace: str | None = None, token: bool | str | None = None
    ) -> JobInfo:
        self.calls.append(("inspect_job", {"job_id": job_id, "namespace": namespace}))
        box = self._job(job_id, "GET", f"https://huggingface.co/api/jobs/{namespace}/{job_id}")
        return JobInfo(
            id=job_id,
            dockerImage=box.image,
            status={"stage": box.stage, "message": None},
            owner={"id": "0", "name": USER, "type": "user"},
        )

    def cancel_job(
        self, *, job_id: str, namespace: str | None = None, token: bool | str | None = None
    ) -> None:
        self.calls.append(("cancel_job", {"job_id": job_id, "namespace": namespace}))
        url = f"https://huggingface.co/api/jobs/{namespace}/{job_id}/cancel"
        self._job(job_id, "POST", url)._cancel_job()


def _decode(data: bytes | None) -> str:
    return codecs.decode(data or b"", "utf-8", errors="replace")
