"""What the bwrap backend adds over local: the host's files out of sight, system dirs read-only,
processes that escape every marker still killed, a network of its own (the host's loopback, its
abstract sockets and the internet unreachable; the proxy reached over a relayed unix socket; a
`network="host"` opt-in), a disk cap, and a real Pi episode end to end. The shared behaviour is
in tests/test_sandbox_conformance.py; attacks from inside real episodes in
tests/test_sandbox_attacks.py."""

from __future__ import annotations

import http.server
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import gymnasium
import pytest
from sandbox_conformance import alive, unique_sleep, wait_until

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.harness import harness_cache_dir, load_harness
from harness_gym.sandbox import SandboxError, SandboxSpec, default_sandbox, load_sandbox
from harness_gym.sandbox.bwrap import BwrapSandbox, BwrapSandboxBackend, bwrap_available

pytestmark = pytest.mark.skipif(
    not bwrap_available(),
    reason="bubblewrap is not installed or cannot make namespaces here (apt-get install bubblewrap)",
)


@pytest.fixture
def box() -> Iterator[BwrapSandbox]:
    sandbox = BwrapSandboxBackend().create(SandboxSpec())
    yield sandbox
    sandbox.close()


def test_the_bwrap_backend_is_found_by_its_entry_point_name() -> None:
    assert isinstance(load_sandbox("bwrap"), BwrapSandboxBackend)


def test_bwrap_is_the_default_where_it_works() -> None:
    assert default_sandbox() == "bwrap"


def test_a_secret_file_of_the_host_is_not_visible_inside(box: BwrapSandbox, tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    in_root = Path.home() / f".harness-gym-test-secret-{uuid.uuid4().hex[:8]}"
    in_root.write_text("root's secret")
    try:
        for secret in (outside, in_root):
            result = box.exec(["cat", str(secret)])
            assert result.exit_code != 0 and "secret" not in result.stdout
        assert box.exec(f"ls -A {Path.home()}/.ssh {Path.home()}/.bash_history").exit_code != 0
    finally:
        in_root.unlink()


def test_system_dirs_are_read_only_and_cannot_be_remounted(box: BwrapSandbox) -> None:
    assert "Read-only file system" in box.exec("touch /usr/harness-gym-probe").stderr
    assert box.exec("echo x >> /etc/hostname").exit_code != 0
    assert box.exec("mount -o remount,rw /usr").exit_code != 0
    assert not Path("/usr/harness-gym-probe").exists()


def test_the_work_dir_and_home_are_at_their_host_paths_and_writable(box: BwrapSandbox) -> None:
    assert box.exec("pwd").stdout.strip() == box.workdir
    box.exec("echo from-inside > made.txt && echo cfg > ~/.config-file")
    assert Path(box.workdir, "made.txt").read_text() == "from-inside\n"
    assert Path(box.home, ".config-file").read_text() == "cfg\n"


def test_this_python_is_there_and_the_harness_cache_is_not(box: BwrapSandbox) -> None:
    result = box.exec("python -c 'import pytest, sys; print(sys.prefix)'")
    assert result.exit_code == 0, result.stderr
    assert box.exec(["test", "-e", str(harness_cache_dir())]).exit_code != 0


def test_the_specs_read_only_mounts_are_there_read_only(tmp_path: Path) -> None:
    host = tmp_path / "install"
    host.mkdir()
    (host / "cli").write_text("#!/bin/sh\n")
    system_target = "/usr/share/harness-gym-probe"  # inside a system dir: left out
    spec = SandboxSpec(ro_mounts={str(host): "/opt-harness/install",
                                  str(host / "cli"): system_target})
    with BwrapSandboxBackend().create(spec) as box:
        assert box.exec("cat /opt-harness/install/cli").stdout == "#!/bin/sh\n"
        assert box.exec("touch /opt-harness/install/probe").exit_code != 0
        assert box.exec(["test", "-e", system_target]).exit_code != 0


def test_an_escapee_with_a_scrubbed_environment_dies_with_its_job(box: BwrapSandbox) -> None:
    # `env -i` leaves no marker for local's search to find; the pid namespace still holds it.
    sleep, marker = unique_sleep()
    job = box.start(f"env -i setsid -f {sleep}; sleep 1000")
    assert wait_until(lambda: len(alive(marker)) >= 2)  # bwrap's own command lines carry it too
    job.kill()
    assert wait_until(lambda: alive(marker) == [])


def test_a_setsid_process_is_killed_on_close() -> None:
    box = BwrapSandboxBackend().create(SandboxSpec())
    sleep, marker = unique_sleep()
    box.start(f"setsid -f {sleep}; setsid {sleep} & sleep 1000")
    assert wait_until(lambda: len(alive(marker)) >= 3)
    box.close()
    assert wait_until(lambda: alive(marker) == [])


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on the host's loopback; its URL and the paths it was asked for."""
    asked: list[str] = []

    class Recording(_Hello):
        def do_GET(self) -> None:
            asked.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def _fetch(url: str) -> str:
    return (
        "import urllib.request\n"
        "try:\n"
        f"    print(urllib.request.urlopen({url!r}, timeout=10).read().decode())\n"
        "except OSError as e:\n"
        "    print('refused', type(e).__name__)\n"
    )


def _run_in_job(box: BwrapSandbox, code: str) -> str:
    """Run Python code as the harness runs: a background job (the only kind that gets the
    proxy forwarder)."""
    job = box.start(["python", "-c", code])
    result = job.wait(timeout=60)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_the_hosts_loopback_is_unreachable_and_the_proxy_url_reaches_the_proxy(
    box: BwrapSandbox, host_server: tuple[str, list[str]]
) -> None:
    proxy, asked = host_server
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)  # a host service
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        service = f"http://127.0.0.1:{other.server_address[1]}/"
        url = box.proxy_url(proxy)
        assert url == proxy  # the same URL inside: the forwarder listens on the same port
        assert _run_in_job(box, _fetch(url + "/v1/models")) == "hello from the host\n"
        assert asked == ["/v1/models"]
        assert _run_in_job(box, _fetch(service)).startswith("refused")
        assert box.exec(["python", "-c", _fetch(url)]).stdout.startswith("refused")  # exec: none
    finally:
        other.shutdown()
        other.server_close()


def test_the_proxy_url_works_from_a_sandbox_under_a_deep_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_server: tuple[str, list[str]]
) -> None:
    # A Ray runner's sandboxes live deep in its node's temp dir: the relay socket's path is past
    # the 108 bytes a unix socket address may have.
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    proxy, asked = host_server
    with BwrapSandboxBackend().create(SandboxSpec()) as box:
        url = box.proxy_url(proxy)
        assert len(str(Path(box.root, "run", "p65535.sock"))) > 108
        assert _run_in_job(box, _fetch(url + "/v1/models")) == "hello from the host\n"
    assert asked == ["/v1/models"]


def test_no_route_leaves_the_sandbox(box: BwrapSandbox) -> None:
    assert box.exec("tail -n +2 /proc/net/route").stdout == ""
    probe = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3); print('connected')\n"
        "except OSError as e:\n"
        "    print(e.errno)\n"
    )
    assert box.exec(["python", "-c", probe]).stdout.strip() == "101"  # ENETUNREACH, at once


def test_the_hosts_abstract_unix_sockets_are_unreachable(box: BwrapSandbox) -> None:
    name = f"\0harness-gym-probe-{uuid.uuid4().hex[:8]}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(name)
    listener.listen()
    try:
        probe = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            "    s.connect('\\0' + sys.argv[1]); print('connected')\n"
            "except OSError as e:\n"
            "    print('refused')\n"
        )
        # Reachable from this host's network namespace, not from the sandbox's.
        assert box.exec(["python", "-c", probe, name[1:]]).stdout == "refused\n"
        with BwrapSandboxBackend(network="host").create(SandboxSpec()) as shared:
            assert shared.exec(["python", "-c", probe, name[1:]]).stdout == "connected\n"
    finally:
        listener.close()


def test_the_relay_socket_cannot_be_removed_or_replaced_from_inside(
    box: BwrapSandbox, host_server: tuple[str, list[str]]
) -> None:
    proxy, _ = host_server
    box.proxy_url(proxy)
    (sock,) = (box.root / "run").iterdir()
    result = box.exec(f"rm -f {sock} || echo refused; : > {sock}.x || echo refused")
    assert result.stdout == "refused\nrefused\n"
    assert sock.is_socket()


def test_kill_processes_stops_the_relay(
    box: BwrapSandbox, host_server: tuple[str, list[str]]
) -> None:
    proxy, asked = host_server
    box.proxy_url(proxy)
    box.kill_processes()
    assert list((box.root / "run").iterdir()) == []
    assert _run_in_job(box, _fetch(proxy)).startswith("refused")  # the grader reaches nothing
    assert asked == []


def test_network_host_is_an_opt_in_that_reaches_the_hosts_loopback(
    host_server: tuple[str, list[str]],
) -> None:
    url, asked = host_server
    with BwrapSandboxBackend(network="host").create(SandboxSpec()) as box:
        assert box.proxy_url(url) == url
        assert box.exec(["python", "-c", _fetch(url + "/x")]).stdout == "hello from the host\n"
    assert asked == ["/x"]
    with pytest.raises(SandboxError, match="network"):
        BwrapSandboxBackend(network="bridge")  # type: ignore[arg-type]


def test_filling_the_disk_kills_the_sandboxs_processes_and_says_why() -> None:
    cap = 16 * 2**20
    backend = BwrapSandboxBackend(disk_bytes=cap)
    with backend.create(SandboxSpec()) as box:
        sleep, marker = unique_sleep()
        # Many files (RLIMIT_FSIZE stops one big file at the cap by itself), then linger.
        job = box.start(f"for i in $(seq 1000); do head -c 1048576 /dev/zero > f$i; done; {sleep}")
        assert wait_until(lambda: box.fault is not None, timeout=30)
        assert "disk cap" in box.fault
        assert wait_until(lambda: job.poll() is not None and alive(marker) == [])
        written = sum(p.stat().st_size for p in Path(box.workdir).glob("f*"))
        assert written < 8 * cap  # stopped within its next check, not at 1000 MiB
        assert box.exec("echo the grader can still run").exit_code == 0


def test_one_file_stops_at_the_disk_cap() -> None:
    cap = 8 * 2**20
    with BwrapSandboxBackend(disk_bytes=cap).create(SandboxSpec()) as box:
        result = box.exec("head -c 100000000 /dev/zero > big")
        assert result.exit_code != 0  # SIGXFSZ: RLIMIT_FSIZE at the cap
        assert Path(box.workdir, "big").stat().st_size <= cap


def test_create_exec_and_close_stay_cheap() -> None:
    backend = BwrapSandboxBackend()
    backend.create(SandboxSpec()).close()
    rounds = 10
    started = time.perf_counter()
    for _ in range(rounds):
        with backend.create(SandboxSpec()) as box:
            box.exec("true")
    per_rollout = (time.perf_counter() - started) / rounds
    assert per_rollout < 0.5, f"{per_rollout * 1000:.0f} ms per create+exec+close"  # 10-55 ms here, by load


def test_a_closed_sandbox_refuses_new_commands() -> None:
    box = BwrapSandboxBackend().create(SandboxSpec())
    box.close()
    with pytest.raises(SandboxError, match="closed"):
        box.exec("true")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pi_episode_with_the_oracle_passes_inside_bwrap() -> None:
    if not load_harness("pi").is_installed():
        pytest.skip("Pi is not installed in the harness cache (`harness-gym harnesses --install`)")
    env = gymnasium.make("HarnessSWE-v0", harness="pi", engine="oracle", sandbox="bwrap")
    try:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(None)
        assert info["outcome"] == "passed", info
        assert terminated and reward > 0
    finally:
        env.close()


def _bwrap_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """A `bwrap` ahead of the real one on PATH: a host where bubblewrap misbehaves so."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")


def test_a_host_without_namespaces_is_refused_with_bwraps_own_words(tmp_path, monkeypatch):
    import harness_gym.sandbox.bwrap as bwrap

    monkeypatch.setattr(bwrap, "_WORKS", set())
    _bwrap_on_path(tmp_path, monkeypatch,
                   "echo 'bwrap: No permissions to create new namespace' >&2; exit 1")
    assert not bwrap_available()
    with pytest.raises(SandboxError, match=r"cannot run here \(bwrap exits 1: bwrap: No "
                                           r"permissions to create new namespace\).*docker"):
        BwrapSandboxBackend().create(SandboxSpec())


def test_a_probe_that_times_out_is_tried_again_and_then_named_so(tmp_path, monkeypatch):
    import harness_gym.sandbox.bwrap as bwrap

    monkeypatch.setattr(bwrap, "_WORKS", set())
    monkeypatch.setattr(bwrap, "_PROBE_TIMEOUTS_S", (0.2, 0.3))
    tries = tmp_path / "tries"
    _bwrap_on_path(tmp_path, monkeypatch, f"echo try >> {tries}; exec sleep 30")
    assert bwrap.bwrap_unavailable_because() == "bwrap made no namespaces within 0 s"
    assert tries.read_text().count("try") == 2
    # the second try, slower than the first allowed, is what counts
    tries.unlink()
    _bwrap_on_path(tmp_path / "slow", monkeypatch,
                   f"echo try >> {tries}; [ $(wc -l < {tries}) -gt 1 ] || exec sleep 30")
    assert bwrap.bwrap_unavailable_because() is None and tries.read_text().count("try") == 2


def test_once_bwrap_has_worked_a_busy_host_cannot_fail_a_sandboxs_start(tmp_path, monkeypatch):
    """A success is kept for the process: a later start does not probe again, so a probe slowed
    or failed by load (seen beside a training run: 'bubblewrap cannot run here' mid-suite)
    cannot refuse a sandbox on a host where bwrap works."""
    import harness_gym.sandbox.bwrap as bwrap

    monkeypatch.setattr(bwrap, "_WORKS", set())
    assert bwrap.bwrap_unavailable_because() is None  # the real bwrap
    probed = tmp_path / "probed"
    _bwrap_on_path(tmp_path, monkeypatch, f"touch {probed}; exit 1")
    assert bwrap_available() and not probed.exists()
    assert bwrap.bwrap_unavailable_because("host") is not None  # another network: probed
    assert probed.exists()
