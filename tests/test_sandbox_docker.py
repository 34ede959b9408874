"""What the docker sandbox adds to the shared suite: isolation between live containers, limits,
no network but the proxy path, reaping of stale containers. Real daemon, real image."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness_gym.sandbox import SandboxError, SandboxSpec
from harness_gym.sandbox.docker import (
    DEFAULT_IMAGE,
    LABEL,
    DockerSandbox,
    DockerSandboxBackend,
    docker_unavailable,
    owner_labels,
)

_NO_DOCKER = docker_unavailable()
pytestmark = pytest.mark.skipif(_NO_DOCKER is not None, reason=str(_NO_DOCKER))


@pytest.fixture
def backend() -> Iterator[DockerSandboxBackend]:
    backend = DockerSandboxBackend(cpus=1.5, memory="512m", pids=300)
    yield backend
    backend.close()


@pytest.fixture
def box(backend: DockerSandboxBackend) -> Iterator[DockerSandbox]:
    with backend.create(SandboxSpec()) as sandbox:
        yield sandbox


def _container_ids(backend: DockerSandboxBackend) -> set[str]:
    found = backend._client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
    return {c.id for c in found}


def test_the_task_repo_is_copied_in_with_its_history(
    backend: DockerSandboxBackend, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text("print('hi')\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=repo, check=True)
    with backend.create(SandboxSpec(repo=repo)) as box:
        assert box.exec("python app.py").stdout == "hi\n"
        assert box.exec("git log --format=%s").stdout == "first\n"
        box.exec("echo changed >> app.py")
        assert box.exec("git status --porcelain").stdout == " M app.py\n"
    assert (repo / "app.py").read_text() == "print('hi')\n"


def test_two_live_containers_cannot_see_or_touch_each_others_files(
    backend: DockerSandboxBackend,
) -> None:
    with backend.create(SandboxSpec()) as a, backend.create(SandboxSpec()) as b:
        b.write_file("secret.txt", "b's")
        # Both busy at once: a tries to find and write b's tree while b keeps running.
        busy = b.start("sleep 2")
        assert a.exec("ls /sandbox").stdout.split() == [a.id]
        assert a.exec(f"cat {b.workdir}/secret.txt").exit_code != 0
        assert a.exec(f"mkdir -p {b.workdir} && echo a > {b.workdir}/secret.txt").exit_code == 0
        assert b.read_file("secret.txt") == b"b's"
        assert busy.wait(timeout=10).exit_code == 0


def test_the_backends_limits_are_set_on_the_container(
    backend: DockerSandboxBackend, box: DockerSandbox
) -> None:
    box.container.reload()
    host = box.container.attrs["HostConfig"]
    assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (
        1_500_000_000,
        512 * 1024**2,
        300,
    )
    # And the kernel enforces them: a fork bomb's children stop at the pid limit.
    pids = box.exec("cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max")
    assert pids.stdout.strip() == "300"


def test_the_container_has_no_network_but_its_own_loopback(box: DockerSandbox) -> None:
    box.container.reload()
    assert box.container.attrs["HostConfig"]["NetworkMode"] == "none"
    routes = box.exec("tail -n +2 /proc/net/route").stdout
    assert routes == ""  # no default route: nothing leaves the container
    probe = (
        "import socket, time\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, round(time.monotonic() - t, 2))\n"
    )
    outcome, seconds = box.exec(["python3", "-c", probe]).stdout.split()
    assert outcome == "OSError" and float(seconds) < 0.5  # ENETUNREACH, at once


class _Payload(http.server.BaseHTTPRequestHandler):
    body = bytes(range(256)) * 4096  # 1 MiB, every byte value

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Payload)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_proxy_url_reaches_a_host_server_from_inside(
    box: DockerSandbox, host_server: str
) -> None:
    url = box.proxy_url(host_server)
    assert url == host_server  # the same port on the container's own loopback
    assert box.proxy_url(host_server) == url  # a second call reuses the relay
    fetch = (
        "import hashlib, sys, urllib.request\n"
        "for _ in range(3):\n"
        "    print(hashlib.sha256(urllib.request.urlopen(sys.argv[1]).read()).hexdigest())\n"
    )
    import hashlib

    digest = hashlib.sha256(_Payload.body).hexdigest()
    assert box.exec(["python3", "-c", fetch, url]).stdout.split() == [digest] * 3


def test_proxy_url_refuses_what_it_cannot_relay(box: DockerSandbox) -> None:
    with pytest.raises(SandboxError, match="http://host:port"):
        box.proxy_url("https://example.com/v1")


def test_close_removes_the_container_and_its_host_dir(backend: DockerSandboxBackend) -> None:
    box = backend.create(SandboxSpec())
    run_dir = box._run_dir
    assert box.container.id in _container_ids(backend)
    box.close()
    assert box.container.id not in _container_ids(backend)
    assert not run_dir.exists()


def test_containers_of_a_dead_owner_are_reaped_and_a_live_owners_kept(
    backend: DockerSandboxBackend,
) -> None:
    from docker.errors import NotFound

    dead = subprocess.Popen(["sleep", "1000"])
    labels = owner_labels(dead.pid)  # taken while it lives, as a real owner's would be
    dead.kill()
    dead.wait()
    client = backend._client
    orphan = client.containers.create(DEFAULT_IMAGE, ["sleep", "infinity"], labels=labels)
    kept = client.containers.create(DEFAULT_IMAGE, ["sleep", "infinity"], labels=owner_labels())
    foreign = client.containers.create(
        DEFAULT_IMAGE, ["sleep", "infinity"], labels={**labels, f"{LABEL}.owner-host": "elsewhere"}
    )
    try:
        DockerSandboxBackend().close()  # a new backend reaps at start
        left = _container_ids(backend)
        assert orphan.id not in left
        assert kept.id in left and foreign.id in left
    finally:
        for container in (orphan, kept, foreign):
            with contextlib.suppress(NotFound):
                container.remove(force=True)


def test_a_missing_image_says_how_to_build_one(backend: DockerSandboxBackend) -> None:
    with pytest.raises(SandboxError, match="scripts/docker-image"):
        backend.create(SandboxSpec(image="harness-gym/no-such-image:0"))


def test_create_exec_close_overhead_is_small(backend: DockerSandboxBackend) -> None:
    started = time.monotonic()
    box = backend.create(SandboxSpec())
    created = time.monotonic()
    assert box.exec("true").exit_code == 0
    executed = time.monotonic()
    box.close()
    closed = time.monotonic()
    print(
        f"docker sandbox: create {created - started:.3f} s, exec {executed - created:.3f} s,"
        f" close {closed - executed:.3f} s"
    )
    assert closed - started < 10


class _ProxiedDockerBackend(DockerSandboxBackend):
    """Relays each new sandbox to the proxy, as the env does once it calls `proxy_url`."""

    proxy_url = ""

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        box = super().create(spec)
        assert box.proxy_url(self.proxy_url) == self.proxy_url
        return box


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pi_episode_with_the_oracle_passes_inside_docker() -> None:
    from harness_gym.tasks.loader import load_tasks

    from harness_gym.engines import load_engine
    from harness_gym.episode import EpisodeRunner
    from harness_gym.harness import load_harness
    from harness_gym.proxy import InterceptionProxy
    from harness_gym.config import EpisodeConfig

    pi = load_harness("pi")
    if not pi.is_installed():
        pytest.skip("Pi is not installed in the harness cache (`harness-gym harnesses --install`)")
    task = load_tasks("builtin")[0]
    proxy = InterceptionProxy(load_engine("oracle")).start()
    proxy.engine.on_episode_start(task)
    backend = _ProxiedDockerBackend()
    backend.proxy_url = proxy.url
    config = EpisodeConfig(harness=pi, engine=proxy.engine, sandbox=backend,
                           episode_timeout_s=300, test_timeout_s=300)
    runner = EpisodeRunner(proxy, pi, backend, config)
    try:
        result = runner.run(task)
        assert result.outcome == "passed", (result.error, result.harness_output, result.grade)
        assert result.n_tool_calls == 1 and result.reward > 0
    finally:
        runner.close()
        proxy.stop()
        proxy.engine.close()
        backend.close()


def test_an_agent_that_stops_its_container_is_a_fault_not_an_error(box: DockerSandbox) -> None:
    box.exec("kill -9 1 $(cat /proc/1/task/1/children)")  # init and the sleep that keeps it up
    box.kill_processes()  # no exception: the agent broke its own episode (harness_error)
    assert box.fault is not None and "stopped its own container" in box.fault



def test_a_started_commands_process_exists_when_start_returns(box: DockerSandbox) -> None:
    """Docker answers `exec_start` before the process exists (its pid still 0): a
    `kill_processes()` right after `start()` could find nothing and the command ran after it,
    as the agent's writer in test_grade_alone did under load (graded `passed`). `start()`
    returns once the daemon reports the process's pid."""
    jobs = [box.start("exec sleep 30") for _ in range(10)]
    pids = [box._api.exec_inspect(job.exec_id)["Pid"] for job in jobs]
    assert all(pid > 0 for pid in pids), pids
    box.kill_processes()
    assert all(not box._api.exec_inspect(job.exec_id)["Running"] for job in jobs)
