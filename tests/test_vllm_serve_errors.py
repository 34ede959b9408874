"""Mistakes around a vLLM server say so in one line, without vLLM installed: nothing listening,
a server that accepts but never answers, a Python without vllm (the supervised server exits
while loading), no vLLM anywhere. Real sockets, real subprocesses, the real CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

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
