"""An env releases the engine it owns at `close()`, for every engine kind: threads, open file
descriptors and sockets, and child processes are counted before and after.

Each kind runs twice: the first env warms what is process-wide by design (imports, torch's
thread pool, tokenizer caches), the second is measured. The env makes one real model call
through its proxy first, so engines that open connections lazily (vLLM's HTTP clients) have
something to release. The vLLM engine talks to the repository's vLLM wire server (real HTTP,
the tiny model) in a child process, so its server-side sockets are not counted as ours.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import httpx
import pytest

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.harness import Endpoint, HarnessOutput, HarnessSpec, Package

SERVER = Path(__file__).parent / "support" / "serve_vllm_wire.py"


class UnusedHarness(HarnessSpec):
    """Installs nothing and is never launched: these tests are about the engine."""

    name = "unused"
    package = Package("npm", "unused-test-only", "0.0.0", bin="unused")
    dialect = "openai-chat"
    shell_tool = "bash"

    def install(self, cache_dir=None, progress=None):
        return self.install_dir(cache_dir)

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return []

    def parse_output(self, stdout: str) -> HarnessOutput:
        return HarnessOutput(None, None, "")


@dataclass(frozen=True)
class Resources:
    threads: tuple[str, ...]
    fds: int
    sockets: int
    children: frozenset[int]


def resources() -> Resources:
    fds = sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd listing itself, closed meanwhile
            continue
        fds += 1
        sockets += target.startswith("socket:")
    threads = tuple(sorted(t.name for t in threading.enumerate()))
    return Resources(threads, fds, sockets, frozenset(children(os.getpid())))


def children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    server = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        assert url.startswith("http://"), "the vLLM wire server did not start"
        yield url
    finally:
        server.terminate()
        server.wait(30)


def one_env(engine: str) -> object:
    """Make an env, call its model once, close it; return its engine object, which the caller
    keeps alive, so only `close()` (not garbage collection) can have released it."""
    env = gym.make("HarnessSWE-v0", harness=UnusedHarness(), engine=engine, sandbox="local",
                   progress=False)
    try:
        stack = env.unwrapped._start()
        proxy = stack.proxy
        session = proxy.open_session(sampling={"max_tokens": 4})
        answer = httpx.post(
            f"{proxy.base_url}/chat/completions", timeout=60,
            headers={"authorization": f"Bearer {session.session_id}"},
            json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200, answer.text
        return stack.engine
    finally:
        env.close()


def assert_released(engine: str) -> None:
    one_env(engine)
    gc.collect()
    before = resources()
    kept = one_env(engine)  # noqa: F841  (alive until the end)
    deadline = time.monotonic() + 10
    while (after := resources()) != before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.2)
    assert after.threads == before.threads
    assert after.children == before.children
    assert (after.sockets, after.fds) == (before.sockets, before.fds)


@pytest.mark.parametrize("engine", ["tiny", "oracle", "oracle:noop", "teacher", "hf:TINY_DIR"])
def test_an_env_releases_a_local_engine_it_owns(engine: str) -> None:
    if engine == "hf:TINY_DIR":  # any local transformers model directory
        from harness_gym.engines.tiny import tiny_model_dir

        engine = f"hf:{tiny_model_dir()}"
    assert_released(engine)


def test_an_env_releases_a_vllm_engine_it_owns(vllm_url: str) -> None:
    assert_released(f"vllm:{vllm_url}?tokenizer=tiny")


def test_an_env_releases_smollm2() -> None:
    from harness_gym.engines._cache import cache_root
    from harness_gym.engines.smollm2 import CACHE_NAME

    if not (cache_root() / CACHE_NAME).is_dir():
        pytest.skip("SmolLM2 is not converted yet (its first load takes minutes on a CPU)")
    assert_released("smollm2")
