"""What the bwrap backend adds over local: the host's files out of sight, system dirs read-only,
processes that escape every marker still killed, the host's loopback still reachable, and a
real Pi episode end to end. The shared behaviour is in tests/test_sandbox_conformance.py."""

from __future__ import annotations

import http.server
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


def test_the_harness_reaches_a_server_on_the_hosts_loopback(box: BwrapSandbox) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
        result = box.exec(["python", "-c", fetch], timeout=30)
        assert (result.exit_code, result.stdout) == (0, "hello from the host\n"), result.stderr
    finally:
        server.shutdown()
        server.server_close()


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
