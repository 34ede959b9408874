"""What the cloud backends (`e2b`, `hf`) must do when the cloud fails, as one test class.

A backend's test module subclasses `RemoteSandboxConformance` and says how its fake SDK ends a
machine and refuses a stop. The fakes raise the installed SDKs' own exception classes at the SDK
boundary (tests/test_sdk_contract.py checks that), so these tests see what a user would:

- a machine that ended (killed, past its lifetime, crashed) is a `SandboxError` from every call,
  never a timed-out or failed command, and a real env episode on it ends `infra_error`, not
  `timeout` or `failed`;
- a stop is retried until the service confirms it; a machine that will not stop is named in an
  `UnstoppedSandboxWarning` and tried again when the backend closes.
"""

from __future__ import annotations

import functools
import pickle
import tempfile
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines import Engine, SamplingParams, TokenChunk
from harness_gym.engines.tiny import load_tiny_tokenizer
from harness_gym.harness import Endpoint, HarnessOutput, HarnessSpec, LaunchPlan, Package
from harness_gym.sandbox import Sandbox, SandboxError, SandboxSpec
from harness_gym.sandbox._reaper import UnstoppedSandboxWarning
from harness_gym.sandbox._remote import RemoteShellBackend, RemoteShellSandbox
from harness_gym.tasks.loader import load_tasks

QUICK_STOPS = (0.01, 0.01, 0.01)  # the pauses between stop tries, short for tests


@functools.cache
def tiny_tokenizer() -> Any:
    return load_tiny_tokenizer()


class NoModelEngine(Engine):
    """The episodes below run a harness that makes no model call (any call is a test bug); the
    proxy still wants a tokenizer with a chat template, so it gets the tiny model's."""

    model_name = "no-model"

    def __init__(self) -> None:
        self.stop_token_ids = (self.tokenizer.get_vocab()["<|im_end|>"],)

    @property
    def tokenizer(self) -> Any:
        return tiny_tokenizer()

    def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        raise AssertionError("these episodes make no model call")


class ScriptHarness(HarnessSpec):
    """A harness CLI stand-in that runs a shell script while its machine is ended under it,
    `end_after_s` into the run, or else once the script has exited, before the grading."""

    name = "script"
    package = Package("npm", "script-harness-test-only", "0.0.0", bin="script")
    dialect = "openai-chat"
    shell_tool = "bash"

    def __init__(
        self, script: str, end_machine: Callable[[Sandbox], None], end_after_s: float | None = None
    ) -> None:
        self.script = script
        self.end_machine = end_machine
        self.end_after_s = end_after_s
        self._sandbox: Sandbox | None = None

    def install(self, cache_dir=None, progress=None) -> Path:
        return Path(tempfile.gettempdir())

    @property
    def remote_id(self) -> str:
        assert isinstance(self._sandbox, RemoteShellSandbox)
        return self._sandbox.remote_id

    def prepare(
        self, sandbox: Sandbox, endpoint: Endpoint, prompt: str, cache_dir=None
    ) -> LaunchPlan:
        self._sandbox = sandbox
        if self.end_after_s is not None:
            threading.Timer(self.end_after_s, self.end_machine, args=(sandbox,)).start()
        return LaunchPlan(argv=["bash", "-c", self.script])

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return []

    def parse_output(self, stdout: str) -> HarnessOutput:
        # The episode calls this between the CLI's exit and the grading.
        if self.end_after_s is None and self._sandbox is not None:
            self.end_machine(self._sandbox)
        return HarnessOutput(None, None, stdout[-200:])


class RemoteSandboxConformance:
    backend_name: str

    # -- what a backend's test module provides ---------------------------------------------

    def make_backend(self, **options: Any) -> RemoteShellBackend:
        """The backend over its fake SDK, with `stop_delays_s=QUICK_STOPS` unless given."""
        raise NotImplementedError

    def end_machine(self, box: Sandbox) -> None:
        """The service ends the machine (killed, past its lifetime, crashed)."""
        raise NotImplementedError

    def machine_gone(self, box: Sandbox) -> bool:
        raise NotImplementedError

    def refuse_stops(self, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
        """The service refuses the next `n` stops (its API answers 500)."""
        raise NotImplementedError

    # -- fixtures ----------------------------------------------------------------------------

    @pytest.fixture
    def backend(self) -> Iterator[RemoteShellBackend]:
        backend = self.make_backend()
        yield backend
        backend.close()

    @pytest.fixture
    def box(self, backend: RemoteShellBackend) -> Iterator[Sandbox]:
        sandbox = backend.create(SandboxSpec())
        yield sandbox
        sandbox.close()

    def end_soon(self, box: Sandbox, after_s: float = 0.3) -> threading.Timer:
        timer = threading.Timer(after_s, self.end_machine, args=(box,))
        timer.start()
        return timer

    # -- a machine that ended ----------------------------------------------------------------

    def test_a_command_on_a_machine_that_ended_is_a_sandbox_error_not_a_timeout(self, box) -> None:
        self.end_machine(box)
        with pytest.raises(SandboxError, match=box.remote_id):
            box.exec("true", timeout=30)

    def test_a_machine_that_ends_during_a_command_is_a_sandbox_error(self, box) -> None:
        started = time.monotonic()
        self.end_soon(box)
        with pytest.raises(SandboxError, match=box.remote_id):
            box.exec("sleep 30", timeout=20)
        assert time.monotonic() - started < 10

    def test_a_machine_that_ends_under_a_background_job_fails_its_wait_and_poll(self, box) -> None:
        job = box.start("sleep 30")
        started = time.monotonic()
        self.end_soon(box)
        with pytest.raises(SandboxError, match=box.remote_id):
            job.wait(timeout=20)
        assert time.monotonic() - started < 10
        with pytest.raises(SandboxError):
            job.poll()

    def test_files_on_a_machine_that_ended_are_sandbox_errors(self, box) -> None:
        box.write_file("kept.txt", "x")
        self.end_machine(box)
        with pytest.raises(SandboxError, match=box.remote_id):
            box.read_file("kept.txt")
        with pytest.raises(SandboxError):
            box.write_file("new.txt", "y")

    def test_closing_a_sandbox_whose_machine_ended_is_quiet(self, box) -> None:
        self.end_machine(box)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnstoppedSandboxWarning)
            box.close()

    def test_a_backend_still_works_after_a_pickle_round_trip(self, backend) -> None:
        # Ray sends the backend object to its actors by pickle.
        copy = pickle.loads(pickle.dumps(backend))
        with copy.create(SandboxSpec()) as box:
            assert box.exec("echo hi").stdout == "hi\n"
        copy.close()

    # -- a stop that fails -------------------------------------------------------------------

    def test_a_refused_stop_is_retried_until_the_machine_is_gone(
        self, backend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        box = backend.create(SandboxSpec())
        self.refuse_stops(monkeypatch, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnstoppedSandboxWarning)
            box.close()
        assert self.machine_gone(box)
        assert backend.reaper.unstopped() == []

    def test_a_machine_that_will_not_stop_is_named_and_stopped_at_backend_close(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        backend = self.make_backend()
        box = backend.create(SandboxSpec())
        self.refuse_stops(monkeypatch, 10**6)
        with pytest.warns(UnstoppedSandboxWarning, match=box.remote_id) as said:
            box.close()
        assert "billed" in str(said[0].message)
        assert not self.machine_gone(box) and backend.reaper.unstopped() == [box.remote_id]
        self.refuse_stops(monkeypatch, 0)  # the service is back
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnstoppedSandboxWarning)
            backend.close()
        assert self.machine_gone(box) and backend.reaper.unstopped() == []

    def test_a_machine_that_still_will_not_stop_at_backend_close_is_named_again(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        backend = self.make_backend()
        box = backend.create(SandboxSpec())
        self.refuse_stops(monkeypatch, 10**6)
        with pytest.warns(UnstoppedSandboxWarning):
            box.close()
        with pytest.warns(UnstoppedSandboxWarning, match=f"{box.remote_id}.*backend closes"):
            backend.close()
        self.refuse_stops(monkeypatch, 0)
        self.end_machine(box)  # the test's own cleanup

    # -- real env episodes -------------------------------------------------------------------

    def run_episode(self, harness: ScriptHarness, backend: RemoteShellBackend) -> dict[str, Any]:
        env = gym.make(
            "HarnessSWE-v0",
            harness=harness,
            engine=NoModelEngine(),
            sandbox=backend,
            tasks=load_tasks("builtin")[:1],
            episode_timeout_s=60,
        )
        try:
            env.reset(seed=0)
            _, reward, terminated, _, info = env.step(None)
        finally:
            env.close()
        assert terminated
        return {**info, "reward": reward}

    def test_an_episode_whose_machine_dies_during_the_run_ends_infra_error_not_timeout(self):
        backend = self.make_backend(proxy_public_url="https://proxy.invalid")
        started = time.monotonic()
        harness = ScriptHarness("sleep 50", self.end_machine, 0.5)
        info = self.run_episode(harness, backend)
        assert info["outcome"] == "infra_error", info["error"]
        assert harness.remote_id in info["error"] and "background job" in info["error"]
        assert time.monotonic() - started < 40  # not the harness's 50 s, nor the timeout's 60

    def test_an_episode_whose_machine_dies_before_grading_ends_infra_error_not_timeout(self):
        backend = self.make_backend(proxy_public_url="https://proxy.invalid")
        harness = ScriptHarness("exit 0", self.end_machine)
        info = self.run_episode(harness, backend)
        assert info["outcome"] == "infra_error", info["error"]
        assert harness.remote_id in info["error"] and info["tests"] == {}
