"""The `bwrap` sandbox: the `local` layout and cleanup, with every command run under bubblewrap.

Each command gets its own mount, pid, ipc and uts namespaces. Inside it sees the host's system
dirs read-only (/usr, /bin, /lib*, /etc, /opt), this Python's environment read-only at its host
paths (`python -m pytest` works unchanged), the spec's `ro_mounts` (a harness's install), a fresh
/proc and /dev, an empty /tmp, and its own sandbox root read-write at its host path, so paths
in traces, configs and patches are the same inside and out. Nothing else of the host's /root,
/home or other rollouts' dirs is there. File ops act on the host paths directly.

Networking: the host network namespace is kept. The harness must reach the interception proxy
on the host's 127.0.0.1; with `--unshare-net` the sandbox gets a loopback of its own and the
proxy is unreachable. The isolating alternative is to serve the proxy on a unix socket bound
into the sandbox, with a small TCP forwarder inside on 127.0.0.1 (one more process per
rollout, and every harness's streaming traffic through it); isolation here is of files and
processes, which is what rollouts trample on each other through. Outbound access is whatever
the host has (on a training box: package registries at most).

Killing: with `--unshare-pid`, bwrap's own init is pid 1 of the namespace, and when it dies the
kernel kills every process in the namespace, including those that called setsid() and those
with a scrubbed environment (`env -i`) that the marker search of `local` cannot find. bwrap's
outer process is the leader of the command's process group, so `LocalJob.kill` (killpg, then
the marker search) takes the outer process down, `--die-with-parent` takes init with it, and
init takes the rest. That is also why `--new-session` is safe: it moves only the command out of
the group, not init. One consequence: a command's background children die when the command
exits (init exits with it); a harness's tool calls live as long as the harness.

Capabilities are dropped (`--cap-drop ALL`): bwrap run as root keeps them otherwise, and root
with CAP_SYS_ADMIN could remount the read-only /usr read-write.

Exit codes: bwrap reports a command killed by signal n as 128+n, the shell's encoding, so a
`kill -9` reads 137 here where `local` reads -9.

>>> from harness_gym.sandbox import SandboxSpec, load_sandbox
>>> with load_sandbox("bwrap").create(SandboxSpec()) as box:  # doctest: +SKIP
...     box.exec("cat /root/.bashrc").exit_code
1
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .base import SandboxError, SandboxSpec
from .local import LocalJob, LocalSandbox, LocalSandboxBackend, _argv

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
_NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "harness-gym")
_LIFETIME = ("--die-with-parent", "--new-session", "--cap-drop", "ALL")


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
    for d in (Path(sys.prefix), Path(sys.base_prefix)):
        if d.is_dir() and d not in kept and not _in_system_dir(d):
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


@functools.cache
def bwrap_available() -> bool:
    """Whether bubblewrap is installed and can make namespaces here (not in every container)."""
    if shutil.which("bwrap") is None:
        return False
    probe = ["bwrap", *_LIFETIME, *_NAMESPACES, *_system_mounts(), "--proc", "/proc", "true"]
    try:
        return subprocess.run(probe, check=False, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class BwrapSandbox(LocalSandbox):
    """A `LocalSandbox` whose commands run under bwrap; layout, jobs and cleanup are local's."""

    def __init__(self, spec: SandboxSpec, system_mounts: Sequence[str]) -> None:
        super().__init__(spec)
        self._system_mounts = list(system_mounts)
        self._ro_mounts = dict(spec.ro_mounts)
        if "PATH" not in spec.env:
            # The host's `python` may be a shim under /root (pyenv) that is not in here; put
            # this interpreter's bin dir (bound read-only) first, so `python -m pytest` works.
            self._env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self._env['PATH']}"

    def bwrap_argv(self, command: Sequence[str] | str, cwd: str) -> list[str]:
        """The full bwrap command line for `command`, run in `cwd` (a host path)."""
        tools = [arg for d in _python_dirs() for arg in ("--ro-bind", str(d), str(d))]
        # Looked up per command: a harness may be installed after the sandbox was made.
        tools += _ro_mounts(self._ro_mounts)
        return [
            "bwrap", *_LIFETIME, *_NAMESPACES, *self._system_mounts,
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            *tools,  # after the tmpfs: a cache under /tmp must stay visible
            "--bind", str(self.root), str(self.root),
            "--chdir", cwd,
            "--", *_argv(command),
        ]  # fmt: skip

    def _spawn(
        self,
        command: Sequence[str] | str,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdout_path: Path,
        stdin_path: Path | None,
    ) -> LocalJob:
        inside = str(self.path(cwd)) if cwd else self.workdir
        return super()._spawn(self.bwrap_argv(command, inside), cwd, env, stdout_path, stdin_path)


class BwrapSandboxBackend(LocalSandboxBackend):
    """Sandboxes as temp dirs whose commands run in bubblewrap namespaces (see module doc)."""

    name = "bwrap"

    def __init__(self) -> None:
        self._system_mounts = _system_mounts()

    def create(self, spec: SandboxSpec) -> BwrapSandbox:
        if not bwrap_available():
            raise SandboxError(
                "bubblewrap cannot run here: install it (`apt-get install bubblewrap`) on a host"
                " that allows namespaces, or use the `local` sandbox"
            )
        return BwrapSandbox(spec, self._system_mounts)
