"""`auto`, the default engine: SmolLM2 in process for one episode at a time, a real vLLM server
for several at once where vLLM is installed, in process with one log line where it is not.

No model loads here: which spec `auto` becomes is checked where the stacks resolve it.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import harness_gym.episode
from harness_gym.config import EpisodeConfig
from harness_gym.engines import auto, load_engine
from harness_gym.engines.vllm_install import VLLMInstallError
from harness_gym.scaleout.executors import ThreadEpisodeExecutor


@pytest.fixture
def vllm_found(monkeypatch):
    monkeypatch.setattr(auto, "find_vllm_python", lambda: "/usr/bin/python3")


@pytest.fixture
def vllm_missing(monkeypatch):
    def missing():
        raise VLLMInstallError("vLLM is not installed: run `harness-gym vllm-serve --install`")

    monkeypatch.setattr(auto, "find_vllm_python", missing)


def test_auto_is_the_default_engine_of_every_entry_point():
    assert EpisodeConfig().engine == "auto"


def test_one_episode_at_a_time_is_served_in_process_even_where_vllm_is_installed(vllm_found):
    assert auto.engine_for_episodes("auto", 1) == "smollm2"


def test_several_episodes_at_once_get_a_real_vllm_server_where_one_is_installed(vllm_found):
    for n in (2, 8):
        assert auto.engine_for_episodes("auto", n) == "vllm-serve:smollm2?kv_cache_gib=2"


def test_without_vllm_several_episodes_stay_in_process_with_one_log_line(vllm_missing, caplog):
    with caplog.at_level("WARNING", logger=auto.__name__):
        assert auto.engine_for_episodes("auto", 4) == "smollm2"
    (record,) = caplog.records
    assert "4 episodes in flight" in record.getMessage()
    assert "harness-gym vllm-serve --install" in record.getMessage()


@pytest.mark.parametrize("spec", ["smollm2", "tiny", "vllm:http://127.0.0.1:9", " oracle "])
def test_a_named_spec_is_never_swapped(vllm_found, spec):
    assert auto.engine_for_episodes(spec, 8) == spec


def test_auto_with_an_argument_is_refused_in_one_line():
    with pytest.raises(ValueError, match="takes no argument"):
        load_engine("auto:fast")


class SpecSpy:
    """Stands in for the rule where the stacks call it: records (spec, in_flight) and answers
    the free oracle engine, so nothing heavy loads."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, int]] = []

    def __call__(self, spec, in_flight):
        self.calls.append((spec, in_flight))
        return "oracle"


def test_the_stacks_resolve_auto_with_the_episodes_they_run_at_once(monkeypatch):
    spy = SpecSpy()
    monkeypatch.setattr(harness_gym.episode, "engine_for_episodes", spy)
    executor = ThreadEpisodeExecutor(EpisodeConfig(harness="pi", progress=False), max_workers=3)
    executor.close()
    env = gym.make("HarnessSWE-v0", harness="pi", progress=False)
    try:
        env.unwrapped.engine  # noqa: B018  (starts the env's stack)
    finally:
        env.close()
    assert spy.calls == [("auto", 3), ("auto", 1)]
