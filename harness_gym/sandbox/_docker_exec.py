"""What runs inside a `docker` sandbox's container: the wrapper every command runs under, the
scripts that kill its processes, and a command's `Job` (its exec stream and exit code).

The container side of `docker.py`, apart so that the sandbox module reads as the container's
life (create, copy in, relay, close) and this one as a command's.
"""

from __future__ import annotations

import select
import threading
import time
from typing import Any, Protocol

from . import _processes as procs
from .base import Job, SandboxError
from .local import OUTPUT_LIMIT_BYTES

# Runs one command: marks it, sends its output to files, and (emit=1, for `exec`) writes the
# files to the exec stream once it has exited. The mark is set on the command only, so killing
# the marked processes leaves the wrapper alive to report what the command printed.
WRAPPER = r"""
id=$1 out=$2 err=$3 in=$4 emit=$5; shift 5
HARNESS_GYM_JOB_ID=$id "$@" >"$out" 2>"$err" <"$in"
rc=$?
if [ "$emit" = 1 ]; then
  tail -c {limit} "$out"; tail -c {limit} "$err" >&2; rm -f "$out" "$err"
fi
[ "$in" = /dev/null ] || rm -f "$in"
exit $rc
""".replace("{limit}", str(OUTPUT_LIMIT_BYTES))

# How long the daemon may take from `exec_start` to a running process (measured: ms; minutes
# would mean a wedged daemon).
PROCESS_START_S = 120.0

# Checks that the image had files at the repo dir (an empty one is the volume docker made for a
# path the image lacks).
CHECK_WORKDIR = r"""
[ -n "$(ls -A "$1" 2>/dev/null)" ] || { echo "no repository at $1 in the image" >&2; exit 3; }
"""

# SIGKILLs every process in the container but its init (pid 1), the process init started (the
# `sleep` that keeps the container up: init's oldest child, older than anything the agent can
# start or orphan onto init) and itself, zombies left to init, until a scan finds none; then
# prints df's line for /sandbox. Exit 1 if some survive 2000 scans. It forks nothing until then:
# under a fork bomb no pid is free.
KILL_ALL = r"""
oldest= sleeper=
for d in /proc/[0-9]*; do
  read -r stat 2>/dev/null <"$d/stat" || continue
  set -- ${stat##*) }
  [ "$2" = 1 ] || continue
  if [ -z "$oldest" ] || [ "${20}" -lt "$oldest" ]; then oldest=${20} sleeper=${d#/proc/}; fi
done
keep=" 1 $sleeper $$ "
round=0
while :; do
  found=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$keep" in *" $p "*) continue ;; esac
    read -r stat 2>/dev/null <"$d/stat" || continue
    state=${stat##*) }
    [ "${state%% *}" = Z ] && continue
    kill -9 "$p" 2>/dev/null && found=1
  done
  if [ -z "$found" ]; then df -Pk /sandbox | tail -n 1; exit 0; fi
  round=$((round + 1))
  [ "$round" -ge 2000 ] && exit 1
done
"""

# SIGKILLs every process whose environment holds $1=$2, until a scan finds none (a process
# may fork while the scan runs).
KILL_MARKED = r"""
for round in 1 2 3 4 5; do
  found=
  for e in /proc/[0-9]*/environ; do
    if grep -qzx "$1=$2" "$e" 2>/dev/null; then
      p=${e#/proc/}; kill -9 "${p%/environ}" 2>/dev/null && found=1
    fi
  done
  [ -z "$found" ] && break
done
true
"""


class _Container(Protocol):
    """What a job needs of its `DockerSandbox` (a protocol: `docker` imports this module)."""

    _api: Any
    _closed: bool

    def _kill_marked(self, marker: str, value: str) -> None: ...

    def _read_text(self, path: str) -> str: ...


class DockerJob(Job):
    """A command run by `docker exec` under the wrapper; its exec stream ends when it exits."""

    def __init__(self, box: _Container, exec_id: str, sock: Any, job_id: str,
                 stdout_path: str, stderr_path: str, started: float) -> None:  # fmt: skip
        self._box = box
        self.exec_id = exec_id
        self._sock = sock
        self.id = job_id
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self._started = started
        self._code: int | None = None
        self._timed_out = False
        self._lock = threading.Lock()

    def _ended(self, timeout: float | None) -> bool:
        """Wait up to `timeout` for the exec stream to have data or end."""
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN | select.POLLHUP)
        return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))

    def _read_stream(self) -> tuple[bytes, bytes]:
        from docker.utils.socket import (
            consume_socket_output,
            demux_adaptor,
            frames_iter,
        )

        frames = (demux_adaptor(*frame) for frame in frames_iter(self._sock, tty=False))
        out, err = consume_socket_output(frames, demux=True)
        return out or b"", err or b""

    def _inspect_exit(self) -> int | None:
        info = self._box._api.exec_inspect(self.exec_id)
        return None if info["Running"] or info["ExitCode"] is None else int(info["ExitCode"])

    def _reported_exit_code(self) -> int:
        """The wrapper's exit code; the daemon may report it a moment after the stream ends."""
        for _ in range(500):
            code = self._inspect_exit()
            if code is not None:
                return code
            time.sleep(0.01)
        raise SandboxError(f"docker exec {self.exec_id} did not report an exit code")

    def _await_exit(self, timeout: float | None) -> bool:
        return self._sock.closed or self._ended(timeout)  # closed: waited for before

    def _drain(self) -> tuple[bytes, bytes]:
        """What the exec stream carried (once: it is closed after), and the exit code."""
        if self._sock.closed:
            return b"", b""
        out_err = self._read_stream()
        self.close_stream()
        with self._lock:
            if self._code is None:
                self._code = self._reported_exit_code()
        return out_err

    def _ended_code(self) -> int:
        self._drain()
        assert self._code is not None, "_drain reads the exit code"
        return self._code

    def _output(self) -> tuple[str, str]:
        self._drain()  # a background job's output is in its files, not on the stream
        return self._box._read_text(self.stdout_path), self._box._read_text(self.stderr_path)

    def _finish(self, timeout: float | None) -> tuple[bytes, bytes]:
        """`exec`'s wait: the command's output is what its stream carried."""
        if not self._await_exit(timeout):
            self._timed_out = True
            self.kill()
        return self._drain()

    def close_stream(self) -> None:
        """Close the exec's connection to the daemon (SocketIO.close leaves the socket open)."""
        response = getattr(self._sock, "_response", None)
        if response is not None:
            response.close()  # first: it flushes the file objects over the socket
        self._sock.close()
        raw = getattr(self._sock, "_sock", None)
        if raw is not None:
            raw.close()

    def poll(self) -> int | None:
        with self._lock:
            if self._code is None:
                self._code = self._inspect_exit()
            return self._code

    def kill(self) -> None:
        """Kill the command and everything carrying its mark, then wait for the wrapper."""
        if self._box._closed:
            return
        self._box._kill_marked(procs.JOB_MARKER, self.id)
        if not self._sock.closed and self._ended(10):
            with self._lock:
                if self._code is None:
                    self._code = self._reported_exit_code()
