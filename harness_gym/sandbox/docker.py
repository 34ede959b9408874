"""The `docker` sandbox: one container per rollout, with no network but a path to the proxy.

Each sandbox is a container of `SandboxSpec.image` (default `harness-gym/base:1`, built locally
by `scripts/docker-image`: no registry is reachable where this runs) with CPU, memory and pid
limits, `network_mode="none"`, a read-only root filesystem, and the task repo copied in. Inside,
one sandbox's files live under a path of its own, as with `local` and `bwrap`::

    /sandbox/<id>/work   copy of the task repo            (Sandbox.workdir)
    /sandbox/<id>/home   an empty HOME                    (Sandbox.home)
    /sandbox/<id>/tmp    TMPDIR
    /sandbox/<id>/logs   stdout/stderr of commands
    /sandbox/<id>/run    bind mount of a host dir holding the proxy's unix socket

Writable places: /sandbox is a tmpfs volume of `disk` bytes made for this container (an agent
that fills it gets ENOSPC; the host's disk is untouched; its pages count in the container's
memory), /tmp a tmpfs of `tmp`, and a dataset row's checkout (below). The rest of the image is
read-only, the interpreter and its site-packages included: no agent can plant a `.pth` or a
`sitecustomize.py` where the grader's Python would load it.

A spec with `workdir` (a SWE-bench / SWE-rebench row: the repo already lives in the row's image,
at `/testbed` by SWE-bench's convention, checked out at the row's base commit) copies nothing:
`Sandbox.workdir` is that path, made writable as an anonymous volume that docker fills with the
image's files there (on disk, not capped), commands run there, HOME, TMPDIR and logs stay
under /sandbox/<id>/, and every command's git config marks it `safe.directory`
(`GIT_CONFIG_*` variables), so git works on it whichever uid owns it.

The spec's `ro_mounts` are bind-mounted read-only (the episode layer puts a harness's install
there at its host path and the host's `node` at /usr/local/bin/node, so a harness installed on
the host runs unchanged inside; the daemon must run on this host), then the backend's
`extra_mounts`.

Networking: the container has a loopback and nothing else, so it cannot reach the host, other
containers or the internet. The harness reaches the interception proxy through a unix socket:
`Sandbox.proxy_url(host_url)` starts a relay on the host (unix socket in the bound run dir ->
the proxy's TCP address) and a forwarder in the container (127.0.0.1:<same port> -> that
socket), and returns the URL the harness must use inside: the same URL with the host replaced
by 127.0.0.1. The alternative, an `internal` docker network with the proxy bound to the
bridge's gateway address, would make the proxy listen on an interface every container on the
host can reach, and needs the daemon's bridge and iptables, which some hosts lack.

Commands run through `docker exec` under a small sh wrapper that sends the command's output to
files (a background child that keeps stdout open would otherwise hold the exec stream open, as
with pipes in `local`) and marks it with HARNESS_GYM_JOB_ID. A timeout or `Job.kill` kills
every process in the container carrying that mark, so setsid escapees die too.
`kill_processes()` kills every process in the container but its init and the `sleep` that keeps
it up (init's oldest child: nothing the agent starts can be older), marked or not, until a scan
finds none; `close()` removes the container, which kills everything left. A signal death reads
128+n (137 for -9), as the shell reports it. What `exec` and `Job.wait` return of a command's
output is its last `OUTPUT_LIMIT_BYTES`.

Containers and their /sandbox volumes are labelled `harness-gym.sandbox=1` with their owner's
pid, process start time, boot id and host name; a new backend removes labelled containers and
volumes whose owner is gone (a trainer killed with SIGKILL never runs `close()`).

A code block, not a doctest (it needs a docker daemon and the image `scripts/docker-image`
builds)::

    from harness_gym.sandbox import SandboxSpec, load_sandbox
    with load_sandbox("docker").create(SandboxSpec()) as box:
        box.exec("tail -n +2 /proc/net/route").stdout  # '': no routes at all
        url = box.proxy_url(proxy.url)  # "http://127.0.0.1:<proxy's port>", for the harness
"""

from __future__ import annotations

import io
import os
import posixpath
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import _pids
from . import _processes as procs
from ._containers import LABEL, _tar, _tar_tree, owner_is_gone, owner_labels
from ._docker_exec import (
    CHECK_WORKDIR,
    KILL_ALL,
    KILL_MARKED,
    PROCESS_START_S,
    WRAPPER,
    DockerJob,
)
from ._pids import CountCensus, PidsWatch
from ._relay import RELAY_SCRIPT, start_host_relay, stop_relay
from .base import (
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxCaps,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
)
from .local import OUTPUT_LIMIT_BYTES, _argv, _rmtree

DEFAULT_IMAGE = "harness-gym/base:1"  # keep in step with scripts/docker-image
_CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_FULL_KIB = 1024  # /sandbox with less free space than this after the agent's turn is full


def _docker() -> Any:
    try:
        import docker
    except ImportError as exc:
        raise SandboxError(
            "the docker sandbox needs the docker SDK: pip install 'harness-gym[docker]'"
        ) from exc
    return docker


def docker_unavailable(image: str = DEFAULT_IMAGE) -> str | None:
    """Why sandboxes of `image` cannot be made here, or None when they can."""
    try:
        docker = _docker()
    except SandboxError as exc:
        return str(exc)
    import requests

    client = None
    try:
        client = docker.from_env(timeout=10)
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"docker image {image} is missing: build it with scripts/docker-image"
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        return f"no docker daemon answers ({exc}): start one with scripts/docker-image"
    finally:
        if client is not None:
            client.close()
    return None


# -- the sandbox -----------------------------------------------------------------------------


class DockerSandbox(Sandbox):
    """One rollout's container (see module doc). Made by `DockerSandboxBackend.create`."""

    def __init__(self, backend: DockerSandboxBackend, spec: SandboxSpec) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.root = f"/sandbox/{self.id}"
        self.workdir = f"{self.root}/work"
        self._closed = False
        self._lock = threading.Lock()
        if spec.workdir is not None:
            if spec.repo is not None:
                raise SandboxError(
                    f"a SandboxSpec gives repo={spec.repo} or workdir={spec.workdir!r}, not both: "
                    "repo is copied in, workdir is where the image already holds the repo"
                )
            if not posixpath.isabs(spec.workdir):
                raise SandboxError(f"SandboxSpec.workdir must be absolute, got {spec.workdir!r}")
            self.workdir = posixpath.normpath(spec.workdir)
        self.home = f"{self.root}/home"
        self._api = backend._client.api
        self._relays: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self._jobs: list[DockerJob] = []  # background jobs, whose streams close() closes
        self._run_dir = Path(tempfile.mkdtemp(prefix="harness-gym-docker-"))
        self._volume: Any = None
        self._disk = backend.disk
        self._pids_watch = PidsWatch(CountCensus(self._pids_now), backend.pids, self._pids_full)
        self._env = {
            "PATH": _CONTAINER_PATH,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            "SHELL": "/bin/bash",
            "TMPDIR": f"{self.root}/tmp",
            "NO_PROXY": "127.0.0.1,localhost,::1",
            "no_proxy": "127.0.0.1,localhost,::1",
            **spec.env,
        }
        if spec.workdir is not None:  # git refuses a checkout another uid owns unless trusted
            self._env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="safe.directory",
                             GIT_CONFIG_VALUE_0=self.workdir)  # fmt: skip
        image = spec.image or backend.image
        docker = _docker()
        labels = {**owner_labels(), f"{LABEL}.id": self.id, f"{LABEL}.label": spec.label}
        try:
            self._volume = backend._client.volumes.create(
                driver="local",
                driver_opts={"type": "tmpfs", "device": "tmpfs", "o": f"size={backend.disk}"},
                labels=labels,
            )
            Mount = docker.types.Mount
            mounts = [
                Mount("/sandbox", self._volume.name, type="volume"),
                Mount(f"{self.root}/run", str(self._run_dir), type="bind"),
                *(Mount(inside, host, type="bind", read_only=True)
                  for host, inside in backend.read_only_mounts(spec).items()),
            ]  # fmt: skip
            if spec.workdir is not None:  # anonymous: filled from the image, removed with it
                mounts.append(Mount(self.workdir, None, type="volume"))
            self.container = backend._client.containers.create(
                image,
                command=["sleep", "infinity"],
                init=True,  # reaps the orphans a killed command leaves behind
                labels=labels,
                network_mode="none",
                read_only=True,
                tmpfs={"/tmp": f"size={backend.tmp}"},
                nano_cpus=int(backend.cpus * 1e9),
                mem_limit=backend.memory,
                pids_limit=backend.pids,
                mounts=mounts,
                hostname="harness-gym",
                working_dir="/",
            )
        except docker.errors.ImageNotFound as exc:
            self.close()
            raise SandboxError(
                f"docker image {image!r} not found: build it with scripts/docker-image"
            ) from exc
        except docker.errors.DockerException as exc:
            self.close()
            raise SandboxError(f"could not create a container from {image!r}: {exc}") from exc
        try:
            self.container.start()
            # After start: the /sandbox volume is mounted only in a running container.
            layout = [(self.id, None, 0o755)]
            layout += [(f"{self.id}/{d}", None, 0o755) for d in ("home", "tmp", "logs")]
            if spec.repo is None and spec.workdir is None:
                layout.append((f"{self.id}/work", None, 0o755))
            self.container.put_archive("/sandbox", _tar(layout))
            if spec.repo is not None:
                repo = _tar_tree(Path(spec.repo), f"{self.id}/work")
                self.container.put_archive("/sandbox", repo)
            if spec.workdir is not None:
                check = self.container.exec_run(["sh", "-c", CHECK_WORKDIR, "sh", self.workdir])
                if check.exit_code != 0:
                    said = check.output.decode(errors="replace").strip()[-500:]
                    raise SandboxError(
                        f"image {image!r} has no repo at workdir {self.workdir!r} ({said}); "
                        "set the row's repo_path to where its image keeps the checkout"
                    )
        except BaseException as exc:
            self.close()
            if isinstance(exc, SandboxError):
                raise
            source = spec.repo if spec.workdir is None else f"{image}:{spec.workdir}"
            raise SandboxError(f"could not start a sandbox from {source}: {exc}") from exc

    # -- plumbing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            short = self.container.short_id
            raise SandboxError(f"sandbox {self.id} (container {short}) is closed")

    def path(self, path: str) -> str:
        """A sandbox path inside the container: relative paths are relative to the work dir."""
        return posixpath.join(self.workdir, path)

    def _command_env(self, env: Mapping[str, str] | None) -> list[str]:
        merged = {**self._env, **(env or {}), "HOME": self.home, procs.SANDBOX_MARKER: self.id}
        return [f"{k}={v}" for k, v in merged.items()]

    def _spawn(self, command: Sequence[str] | str, cwd: str | None,
               env: Mapping[str, str] | None, stdout_path: str, stdin_path: str,
               emit: bool) -> DockerJob:  # fmt: skip
        self._check_open()
        self._may_have_processes = True
        job_id = uuid.uuid4().hex
        stderr_path = stdout_path + ".stderr"
        argv = ["sh", "-c", WRAPPER, "sh", job_id, stdout_path, stderr_path, stdin_path]
        started = time.monotonic()
        try:
            exec_id = self._api.exec_create(
                self.container.id,
                [*argv, "1" if emit else "0", *_argv(command)],
                environment=self._command_env(env),
                workdir=self.path(cwd) if cwd else self.workdir,
            )["Id"]
            sock = self._api.exec_start(exec_id, socket=True)
            self._await_process(exec_id, command)
        except _docker().errors.DockerException as exc:
            raise SandboxError(f"could not start {command!r}: {exc}") from exc
        return DockerJob(self, exec_id, sock, job_id, stdout_path, stderr_path, started)

    def _await_process(self, exec_id: str, command: Sequence[str] | str) -> None:
        """Return once the exec's process exists. The daemon answers `exec_start` when it has
        upgraded the stream, which can be before containerd has spawned the process: a
        `kill_processes()` right after `start()` then found nothing, and the command started
        after it (grade_alone's docker attack was graded `passed`, 1 run at a load of 23)."""
        deadline = time.monotonic() + PROCESS_START_S
        while True:
            info = self._api.exec_inspect(exec_id)
            if info.get("Pid") or info.get("ExitCode") is not None:
                return
            if time.monotonic() > deadline:
                raise SandboxError(f"{command!r} did not start within {PROCESS_START_S:g} s")
            time.sleep(0.005)

    def _kill_marked(self, marker: str, value: str) -> None:
        """SIGKILL every process in the container whose environment holds marker=value."""
        with self._lock:
            if self._closed:
                return
            self.container.exec_run(["sh", "-c", KILL_MARKED, "sh", marker, value])

    def _read_text(self, path: str) -> str:
        """The file's last `OUTPUT_LIMIT_BYTES` as text ("" if it cannot be read)."""
        if self._closed:
            return ""
        try:
            tail = self.container.exec_run(["tail", "-c", str(OUTPUT_LIMIT_BYTES), path])
        except _docker().errors.DockerException:
            return ""
        return tail.output.decode("utf-8", errors="replace") if tail.exit_code == 0 else ""

    # -- the seam --------------------------------------------------------------------------

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        name = f"{self.root}/logs/{uuid.uuid4().hex[:12]}"
        stdin_path = "/dev/null"
        if stdin is not None:
            stdin_path = f"{name}.in"
            self.write_file(stdin_path, stdin, mode=0o600)
        job = self._spawn(command, cwd, env, f"{name}.out", stdin_path, emit=True)
        out, err = job._finish(timeout)
        return job._result(out.decode(errors="replace"), err.decode(errors="replace"))

    def start(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdout_path: str | None = None,
    ) -> DockerJob:
        """Start in the background. stdout goes to `stdout_path` (default: a file under the
        sandbox's logs/), stderr to the same path plus `.stderr`."""
        default = f"{self.root}/logs/{uuid.uuid4().hex[:12]}.out"
        out = self.path(stdout_path) if stdout_path else default
        job = self._spawn(command, cwd, env, out, "/dev/null", emit=False)
        with self._lock:
            self._jobs.append(job)
        self._pids_watch.start()  # the agent's turn: a harness runs in the background
        return job

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        target = self.path(path)
        parent, name = posixpath.split(target)
        archive = _tar([(name, data.encode() if isinstance(data, str) else data, mode)])
        docker = _docker()
        try:
            try:
                self.container.put_archive(parent, archive)
            except docker.errors.NotFound:
                self.container.exec_run(["mkdir", "-p", parent])
                self.container.put_archive(parent, archive)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"could not write {path} in sandbox {self.id}: {exc}") from exc

    def read_file(self, path: str) -> bytes:
        self._check_open()
        docker = _docker()
        try:
            chunks, _stat = self.container.get_archive(self.path(path))
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                member = tar.next()
                extracted = tar.extractfile(member) if member is not None else None
                if extracted is None:
                    raise SandboxError(f"{path} in sandbox {self.id} is not a file")
                return extracted.read()
        except docker.errors.DockerException as exc:
            raise SandboxError(f"could not read {path} in sandbox {self.id}: {exc}") from exc

    def proxy_url(self, host_url: str) -> str:
        """The URL a command in this sandbox uses to reach `host_url`, an http server on the
        host's loopback (the interception proxy): the same URL with the host set to 127.0.0.1.
        The first call per port starts the host relay and the in-container forwarder."""
        self._check_open()
        parts = urlsplit(host_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise SandboxError(f"proxy_url needs an http://host:port URL, got {host_url!r}")
        port = parts.port or 80
        key = (parts.hostname, port)
        with self._lock:
            if key not in self._relays:
                self._relays[key] = self._start_relay(parts.hostname, port)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))

    def _start_relay(self, host: str, port: int) -> subprocess.Popen[bytes]:
        name = f"proxy-{port}.sock"
        relay = start_host_relay(self._run_dir / name, host, port)
        inside = f"unix:{self.root}/run/{name}"
        forward = ["python3", "-c", RELAY_SCRIPT, f"tcp:127.0.0.1:{port}", inside, "--fork"]
        result = self.container.exec_run(forward)
        if result.exit_code != 0:
            stop_relay(relay)
            raise SandboxError(
                f"could not start the proxy forwarder in the container (does the image have"
                f" python3?): {result.output.decode(errors='replace')[-500:]}"
            )
        return relay

    def _stop_relays(self) -> None:
        with self._lock:
            relays, self._relays = list(self._relays.values()), {}
        for relay in relays:
            stop_relay(relay)

    def kill_processes(self) -> None:
        """Kill every process in the container but its own init and sleep, and stop the proxy
        relay (see `Sandbox.kill_processes`)."""
        self._check_open()
        self._pids_watch.stop()
        self._stop_relays()
        said, code = self._kill_all()
        if code != 0 and self._stopped():  # its processes are gone with it; grading cannot run
            self.fault = "the agent stopped its own container (killed its init or sleep)"
            return
        if code != 0:
            raise SandboxError(f"processes of sandbox {self.id} survived SIGKILL: {said[-500:]}")
        self._may_have_processes = False
        fields = said.split()
        if len(fields) >= 4 and fields[3].isdigit() and int(fields[3]) < _FULL_KIB:
            self.fault = (
                f"the agent filled the sandbox's disk (/sandbox, {self._disk}): commands "
                "cannot write their output there any more"
            )

    def _kill_all(self) -> tuple[str, int]:
        """SIGKILL every process but the container's init and sleep: what the kill said, and
        its exit code (0: done)."""
        said, code = "", 1
        for _ in range(50):  # the exec needs a free pid: a fork bomb may hold every one
            try:
                done = self.container.exec_run(["sh", "-c", KILL_ALL])
            except _docker().errors.APIError as exc:
                said, code = str(exc), 1
                if self._stopped():
                    break
            else:
                said, code = done.output.decode(errors="replace"), done.exit_code
                if code == 0:
                    break
            time.sleep(0.1)
        return said, code

    def _pids_now(self) -> int:
        try:
            stats = self._api.stats(self.container.id, stream=False, one_shot=True)
        except _docker().errors.DockerException:  # gone or stopped: nothing to count
            return 0
        return int((stats.get("pids_stats") or {}).get("current") or 0)

    def _pids_full(self, limit: int) -> None:
        self.fault = (
            f"the sandbox's processes held its process cap of {limit} for {_pids.HELD_S:g} s "
            f"(a fork bomb or a runaway): its processes were killed"
        )
        self._kill_all()

    def _stopped(self) -> bool:
        try:
            self.container.reload()
        except _docker().errors.DockerException:
            return False
        return self.container.status != "running"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            jobs, self._jobs = self._jobs, []
        self._pids_watch.stop()
        docker = _docker()
        container = getattr(self, "container", None)
        if container is not None:
            try:
                container.remove(force=True, v=True)  # v: the workdir's anonymous volume too
            except docker.errors.NotFound:
                pass
        if self._volume is not None:
            try:
                self._volume.remove(force=True)
            except docker.errors.NotFound:
                pass
        for job in jobs:
            job.close_stream()
        self._stop_relays()
        _rmtree(self._run_dir)


class DockerSandboxBackend(SandboxBackend):
    """Sandboxes as containers on the local docker daemon (see module doc).

    `cpus`, `memory` (docker's syntax, e.g. "4g") and `pids` limit each container, `disk` its
    /sandbox tmpfs and `tmp` its /tmp (same syntax; both count in `memory`); `image` is used
    when a spec names none; `extra_mounts` maps host paths to container paths bound read-only
    besides the harness cache. Creating the backend removes labelled containers and volumes
    left by owners that are gone.
    """

    name = "docker"
    runs_images = True  # honours SandboxSpec.image and .workdir: dataset rows run here

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        cpus: float = 2.0,
        memory: str = "4g",
        pids: int = 2048,
        disk: str = "2g",
        tmp: str = "512m",
        extra_mounts: Mapping[str, str] | None = None,
        reap: bool = True,
    ) -> None:
        self.image = image
        self.cpus = cpus
        self.memory = memory
        self.pids = pids
        self.disk = disk
        self.tmp = tmp
        self.extra_mounts = dict(extra_mounts or {})
        docker = _docker()
        import requests

        try:
            self._client = docker.from_env(timeout=60)
            self._client.ping()
        except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
            raise SandboxError(
                f"no docker daemon answers ({exc}); start one, e.g. with scripts/docker-image"
            ) from exc
        if reap:
            self.reap_stale()

    def read_only_mounts(self, spec: SandboxSpec) -> dict[str, str]:
        """Host path -> container path, bound read-only: the spec's, then `extra_mounts`."""
        mounts = {h: p for h, p in spec.ro_mounts.items() if os.path.exists(h)}
        return {**mounts, **self.extra_mounts}

    def reap_stale(self) -> list[str]:
        """Remove labelled containers and volumes whose owner process is gone; their ids."""
        removed = []
        errors = _docker().errors
        stale = {"label": f"{LABEL}=1"}
        for container in self._client.containers.list(all=True, filters=stale):
            if owner_is_gone(container.labels):
                try:
                    container.remove(force=True, v=True)
                    removed.append(container.id)
                except errors.NotFound:
                    pass
        for volume in self._client.volumes.list(filters=stale):
            if owner_is_gone(volume.attrs.get("Labels") or {}):
                try:
                    volume.remove(force=True)
                    removed.append(volume.id)
                except (errors.NotFound, errors.APIError):  # APIError: still in use
                    pass
        return removed

    def set_limits(self, limits: SandboxLimits) -> None:
        self.pids, self.memory = limits.pids, f"{limits.memory_bytes}b"
        self.disk = f"{limits.disk_bytes // 2**10}k"  # tmpfs sizes take k/m/g, not b

    def caps(self) -> SandboxCaps:
        return SandboxCaps(
            pids=f"the container's pids_limit={self.pids}",
            memory=f"the container's mem_limit={self.memory} (its tmpfs /sandbox and /tmp count)",
            disk=f"/sandbox is a tmpfs of {self.disk}, /tmp of {self.tmp}",
        )

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        return DockerSandbox(self, spec)

    def close(self) -> None:
        self._client.close()
