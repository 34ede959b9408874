"""The `bwrap` sandbox (the default): the `local` layout and cleanup, with every command run under
bubblewrap in namespaces of its own.

Each command gets its own mount, pid, network, ipc and uts namespaces. Inside it sees the host's
system dirs read-only (/usr, /bin, /lib*, /etc, /opt), this Python's environment read-only at its
host paths (`python -m pytest` works unchanged, and no agent can plant a `.pth` or
`sitecustomize.py` in the interpreter that grades it), the spec's `ro_mounts` (a harness's
install), a fresh /proc and /dev, size-capped tmpfs /tmp and /dev/shm, and its own sandbox root
read-write at its host path, so paths in traces, configs and patches are the same inside and
out. Nothing else of the host's /root, /home or other rollouts' dirs is there. File ops act on
the host paths directly.

Networking (`network="none"`, the default): a network namespace with nothing but its own
loopback, so host services on 127.0.0.1, other machines and the internet are unreachable. The
harness reaches the interception proxy through a unix socket, as in the `docker` backend:
`proxy_url(host_url)` starts a relay on the host (`<root>/run/p<port>.sock` -> the proxy's TCP
address, `_relay.py`), and every later background command (`start`: the harness) first starts a
forwarder inside its namespace (127.0.0.1:<port> -> that socket), so the harness uses the
proxy's own URL unchanged. `exec` commands (the episode's setup and grading steps) get none: a
forwarder is one Python start, which they would pay for nothing. The run/
dir is bound read-only: the agent can use the socket, not replace it. Unix sockets outside the
sandbox root are not in the mount namespace (no /run, /var). `kill_processes()` stops the relay:
the grader's commands reach nothing at all.

`network="host"` (opt-in: `BwrapSandboxBackend(network="host")`) keeps the host's network
namespace, for harnesses that must reach something besides the proxy. Its risk: agent code can
then reach every service on the host's loopback (a database, a metrics port, the proxy's own
admin routes when it runs without an admin key), the machine's network and the internet.

Killing: with `--unshare-pid`, bwrap's own init is pid 1 of the command's namespace, and when it
dies the kernel kills every process in the namespace, including those that called setsid(),
double-forked or scrubbed their environment (`env -i`); no process can leave a pid namespace.
A job is killed by SIGKILL to that init; bwrap's outer process, our child, exits only once it has
reaped its init, and the init is reaped only after every other process in the namespace is gone,
so when `Job.kill()` returns the namespace is empty: exact, with no race against a background
writer. `--die-with-parent` covers a trainer killed outright. One consequence: a command's
background children die when the command exits (init exits with it); a harness's tool calls
live as long as the harness.

Limits: where this host lets us make cgroups (root), each sandbox's commands run in its own
cgroup with a pids cap and a memory cap (`_cgroups.py`: a fork bomb stops there, the other
rollouts keep running). Run by a non-root user, bwrap puts each command in a user namespace of
its own (`--unshare-user`), and RLIMIT_NPROC set inside it caps that command's processes alone
(`_rlimits.py`); memory is then capped per process (RLIMIT_DATA). Files are capped as in
`local` (`disk_bytes`), /tmp and /dev/shm are tmpfs of `tmp_bytes` each (RAM: bwrap's default
would be half the host's). `BwrapSandboxBackend.caps()` says which of these hold here.

Capabilities are dropped (`--cap-drop ALL`): bwrap run as root keeps them otherwise, and root
with CAP_SYS_ADMIN could remount the read-only /usr read-write.

Exit codes: bwrap reports a command killed by signal n as 128+n, the shell's encoding, so a
`kill -9` reads 137 here where `local` reads -9.

>>> from harness_gym.sandbox import SandboxSpec, load_sandbox
>>> with load_sandbox("bwrap").create(SandboxSpec()) as box:
...     box.exec("cat /root/.bashrc").exit_code
1
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from . import _processes as procs
from . import _rlimits
from ._relay import RELAY_SCRIPT, start_host_relay, stop_relay
from .base import SandboxCaps, SandboxError, SandboxSpec
from .local import (
    DEFAULT_DISK_BYTES,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_PIDS,
    LocalJob,
    LocalSandbox,
    LocalSandboxBackend,
    SandboxLimits,
    _argv,
    host_caps,
)

Network = Literal["none", "host"]

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
_NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "harness-gym")
_LIFETIME = ("--die-with-parent", "--new-session", "--cap-drop", "ALL")
# A non-root user's bwrap makes a user namespace anyway; asked for, it is sure to be one per
# command, the scope RLIMIT_NPROC counts in (`_rlimits.py`).
_USERNS = ("--unshare-user",) if os.geteuid() != 0 else ()
DEFAULT_TMP_BYTES = 512 * 2**20

# Starts one forwarder per relay inside the command's network namespace, then runs the command:
# sh -c LAUNCH PYTHON RELAY_SCRIPT tcp:127.0.0.1:P unix:SOCK [...] -- COMMAND...
_FORWARD_THEN_RUN = r"""
py=$0 script=$1; shift
while [ "$1" != -- ]; do
  "$py" -I -c "$script" "$1" "$2" --fork ||
    { echo "harness-gym: no proxy forwarder" >&2; exit 125; }
  shift 2
done
shift
exec "$@"
"""


def _system_mounts() -> list[str]:
    """Read-only binds of the system dirs; merged-/usr symlinks (/bin -> usr/bin) stay links."""
    args: list[str] = []
    for top in _SYSTEM_DIRS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _in_system_dir(path: str | Path) -> bool:
    return any(Path(path).is_relative_to(d) for d in _SYSTEM_DIRS)


def _python_dirs() -> list[Path]:
    """This Python's environment (the venv and the interpreter it points at, which may live
    under /root, e.g. pyenv): the grader runs `python -m pytest` with it."""
    kept: list[Path] = []
    # And the site dirs it reads outside them (a venv that borrows another's packages through
    # a .pth line, as a git worktree's may).
    borrowed = [Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    for d in (Path(sys.prefix), Path(sys.base_prefix), *borrowed):
        if d.is_dir() and not _in_system_dir(d) and not any(d.is_relative_to(k) for k in kept):
            kept.append(d)
    return kept


def _ro_mounts(mounts: Mapping[str, str]) -> list[str]:
    """Binds for `SandboxSpec.ro_mounts` whose host path exists. A target inside a system dir is
    left out: those dirs are the host's own, read-only, so no mount point can be made there and
    the host's files there are visible as they are."""
    args: list[str] = []
    for host, inside in mounts.items():
        if os.path.exists(host) and not _in_system_dir(inside):
            args += ["--ro-bind", host, inside]
    return args


def _network_args(network: Network) -> list[str]:
    return ["--unshare-net"] if network == "none" else []


@functools.cache
def _sized_tmpfs() -> bool:
    """Whether this bwrap takes `--size` (0.5+)."""
    try:
        said = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in said.stdout + said.stderr


@functools.cache
def _nproc_holds() -> bool:
    """Whether RLIMIT_NPROC set inside a bwrap command caps it here (measured; never as root)."""
    if os.geteuid() == 0 or shutil.which("bwrap") is None:
        return False
    outer = ("bwrap", *_LIFETIME, *_USERNS, "--unshare-pid", "--ro-bind", "/", "/",
             "--proc", "/proc", "--dev", "/dev", "--")  # fmt: skip
    return _rlimits.nproc_works(outer)


def bwrap_available(network: Network = "none") -> bool:
    """Whether bubblewrap is installed and can make namespaces here (not in every container),
    with a network namespace of its own unless `network="host"`."""
    return bwrap_unavailable_because(network) is None


# Networks bwrap has made namespaces for in this process: a host that allows them once allows
# them for good, so a sandbox's start does not probe again (and a busy host cannot fail it). A
# failure is not kept: it was, and one probe timed out by load refused every later sandbox of
# the process (seen mid-suite beside a training run: 'bubblewrap cannot run here').
_WORKS: set[str] = set()
# A loaded host can take seconds to make a network namespace (the kernel tears old ones down
# under one lock): a probe that times out is tried once more with longer.
_PROBE_TIMEOUTS_S = (10.0, 60.0)


def bwrap_unavailable_because(network: Network = "none") -> str | None:
    """Why bubblewrap cannot make this sandbox's namespaces here, or None where it can."""
    if network in _WORKS:
        return None
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    probe = ["bwrap", *_LIFETIME, *_USERNS, *_NAMESPACES, *_network_args(network),
             *_system_mounts(), "--proc", "/proc", "true"]  # fmt: skip
    for timeout in _PROBE_TIMEOUTS_S:
        try:
            done = subprocess.run(probe, check=False, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            continue
        except OSError as exc:
            return f"bwrap does not start: {exc}"
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[-300:]
            return f"bwrap exits {done.returncode}: {said or 'saying nothing'}"
        _WORKS.add(network)
        return None
    return f"bwrap made no namespaces within {sum(_PROBE_TIMEOUTS_S):.0f} s"


class BwrapJob(LocalJob):
    """A command under bwrap. Killing it kills its pid namespace's init first (see module doc)."""

    def kill(self) -> None:
        with self._lock:
            if procs.peek_exit(self._proc) is None:
                for init in procs.children(self.pid):
                    try:
                        os.kill(init, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                # bwrap exits once it has reaped its init: the namespace is empty by then.
                procs.wait_exit(self._proc, 10)
        super().kill()  # the outer bwrap and its group, if still there


class BwrapSandbox(LocalSandbox):
    """A `LocalSandbox` whose commands run under bwrap; layout, jobs and cleanup are local's."""

    job_class = BwrapJob

    def __init__(
        self,
        spec: SandboxSpec,
        system_mounts: Sequence[str],
        *,
        limits: SandboxLimits | None = None,
        network: Network = "none",
        tmp_bytes: int = DEFAULT_TMP_BYTES,
    ) -> None:
        super().__init__(spec, limits)
        self.network = network
        self._system_mounts = list(system_mounts)
        self._ro_mounts = dict(spec.ro_mounts)
        self._tmp_bytes = tmp_bytes
        self._run_dir = self.root / "run"  # the relays' sockets, bound read-only inside
        self._run_dir.mkdir()
        self._relays: dict[int, tuple[Path, subprocess.Popen[bytes]]] = {}
        self._relay_lock = threading.Lock()
        if "PATH" not in spec.env:
            # The host's `python` may be a shim under /root (pyenv) that is not in here; put
            # this interpreter's bin dir (bound read-only) first, so `python -m pytest` works.
            self._env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self._env['PATH']}"

    def _nproc_prefix(self) -> tuple[str, ...] | None:
        return () if _nproc_holds() else None  # bwrap makes the user namespace itself

    def _nproc_launcher(self) -> list[str]:
        return []  # the rlimit is set inside bwrap (`bwrap_argv`), not before it

    def _pid_namespace_method(self) -> None:
        return None  # each command has a pid namespace of its own, bwrap's (module doc)

    def _scratch_mounts(self) -> list[str]:
        sized = ["--size", str(self._tmp_bytes)] if _sized_tmpfs() else []
        return [*sized, "--tmpfs", "/tmp", *sized, "--tmpfs", "/dev/shm"]

    def _forwarders(self, command: list[str]) -> list[str]:
        """`command`, preceded by a forwarder per relay (none: the command alone)."""
        with self._relay_lock:
            relays = [(port, sock) for port, (sock, _) in self._relays.items()]
        if not relays:
            return command
        pairs = [arg for port, sock in relays for arg in (f"tcp:127.0.0.1:{port}", f"unix:{sock}")]
        return ["sh", "-c", _FORWARD_THEN_RUN, sys.executable, RELAY_SCRIPT, *pairs, "--",
                *command]  # fmt: skip

    def bwrap_argv(
        self, command: Sequence[str] | str, cwd: str, *, forward: bool = False
    ) -> list[str]:
        """The full bwrap command line for `command`, run in `cwd` (a host path); `forward`
        starts the proxy forwarders first."""
        tools = [arg for d in _python_dirs() for arg in ("--ro-bind", str(d), str(d))]
        # Looked up per command: a harness may be installed after the sandbox was made.
        tools += _ro_mounts(self._ro_mounts)
        nproc = _rlimits.prlimit(nproc=self.limits.pids) if self._nproc else []
        return [
            "bwrap", *_LIFETIME, *_USERNS, *_NAMESPACES, *_network_args(self.network),
            *self._system_mounts,
            "--proc", "/proc", "--dev", "/dev", *self._scratch_mounts(),
            *tools,  # after the tmpfs: a cache under /tmp must stay visible
            "--bind", str(self.root), str(self.root),
            "--ro-bind", str(self._run_dir), str(self._run_dir),
            "--chdir", cwd,
            "--", *nproc, *(self._forwarders(_argv(command)) if forward else _argv(command)),
        ]  # fmt: skip

    def _spawn(
        self,
        command: Sequence[str] | str,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdout_path: Path,
        stdin_path: Path | None,
        background: bool = False,
    ) -> LocalJob:
        inside = str(self.path(cwd)) if cwd else self.workdir
        argv = self.bwrap_argv(command, inside, forward=background)
        return super()._spawn(argv, cwd, env, stdout_path, stdin_path, background)

    def proxy_url(self, host_url: str) -> str:
        """The URL commands in this sandbox use to reach `host_url`, an http server on the
        host's loopback (the interception proxy). With `network="none"` the first call per port
        starts the host relay, and every later `start`ed command its forwarder (module doc)."""
        if self.network == "host":
            return host_url
        self._check_open()
        parts = urlsplit(host_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise SandboxError(f"proxy_url needs an http://host:port URL, got {host_url!r}")
        port = parts.port or 80
        with self._relay_lock:
            if port not in self._relays:
                sock = self._run_dir / f"p{port}.sock"
                self._relays[port] = (sock, start_host_relay(sock, parts.hostname, port))
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))

    def _stop_relays(self) -> None:
        with self._relay_lock:
            relays, self._relays = list(self._relays.values()), {}
        for sock, relay in relays:
            stop_relay(relay)
            sock.unlink(missing_ok=True)

    def kill_processes(self) -> None:
        """Kill every namespace the sandbox's commands made (exact: see module doc) and stop
        the proxy relay."""
        self._stop_relays()
        super().kill_processes()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._stop_relays()


class BwrapSandboxBackend(LocalSandboxBackend):
    """Sandboxes as temp dirs whose commands run in bubblewrap namespaces (see module doc).

    `network`: "none" (default: the proxy is all a sandbox reaches) or "host" (opt-in; the
    sandbox shares the host's network: see the module doc for the risk). `pids`,
    `memory_bytes`, `disk_bytes` and `tmp_bytes` cap each sandbox.
    """

    name = "bwrap"

    def __init__(
        self,
        *,
        network: Network = "none",
        pids: int = DEFAULT_PIDS,
        disk_bytes: int = DEFAULT_DISK_BYTES,
        tmp_bytes: int = DEFAULT_TMP_BYTES,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        if network not in ("none", "host"):
            raise SandboxError(f'network is "none" or "host", got {network!r}')
        super().__init__(pids=pids, disk_bytes=disk_bytes, memory_bytes=memory_bytes)
        self.network: Network = network
        self.tmp_bytes = tmp_bytes
        self._system_mounts = _system_mounts()

    def caps(self) -> SandboxCaps:
        how = "inside bwrap's user namespace" if _nproc_holds() else None
        return host_caps(self.limits, how, self.name)

    def create(self, spec: SandboxSpec) -> BwrapSandbox:
        reason = bwrap_unavailable_because(self.network)
        if reason is not None:
            raise SandboxError(
                f"bubblewrap cannot run here ({reason}): install it (`apt-get install "
                "bubblewrap`) on a host that allows namespaces, or use the `docker` sandbox"
            )
        return BwrapSandbox(spec, self._system_mounts, limits=self.limits,
                            network=self.network, tmp_bytes=self.tmp_bytes)  # fmt: skip
