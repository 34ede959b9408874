"""`EpisodeConfig`: one validated set of episode settings behind `make`, `make_vec` and TRL.

Mistakes are reported when the env is made (not at the first reset), with the nearest name, and
without loading a model; the defaults, the default sandbox included, are the same whichever
entry point builds the env.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import gymnasium as gym
import pytest

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.config import SETTINGS, EpisodeConfig, EpisodeConfigError
from harness_gym.harness import HarnessError
from harness_gym.integrations.trl import make_rollout_func
from harness_gym.sandbox import SandboxError


@pytest.mark.parametrize(("setting", "typo", "error", "suggestion"), [
    ("engine", "smollm", EpisodeConfigError, "smollm2"),
    ("engine", "orcale:noop", EpisodeConfigError, "oracle"),
    ("harness", "claude_code", HarnessError, "claude-code"),
    ("sandbox", "bwarp", SandboxError, "bwrap"),
])
def test_a_misspelt_name_fails_at_make_with_the_nearest_name(setting, typo, error, suggestion):
    name = typo.partition(":")[0]
    with pytest.raises(error, match=f"unknown .*{name!r} \\(did you mean {suggestion!r}\\?\\)"):
        gym.make("HarnessSWE-v0", **{setting: typo})


def test_a_misspelt_setting_names_the_nearest_setting():
    with pytest.raises(EpisodeConfigError, match="did you mean 'episode_timeout_s'"):
        gym.make("HarnessSWE-v0", episode_timeout=10)
    with pytest.raises(EpisodeConfigError, match="did you mean 'context_overflow'"):
        gym.make_vec("HarnessSWE-v0", num_envs=1, vectorization_mode="vector_entry_point",
                     context_overflw="truncate")


def test_making_an_env_checks_the_engine_name_without_loading_the_model():
    code = ("import sys, gymnasium as gym, harness_gym; "
            "gym.make('HarnessSWE-v0', engine='smollm2', harness='pi'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False"], out.stderr[-2000:]


@pytest.mark.parametrize(("settings", "message"), [
    ({"episode_timeout_s": 0}, "must be positive"),
    ({"context_overflow": "compact"}, "context_overflow"),
    ({"sampling": {"temprature": 0.5}}, "unknown sampling keys"),
    ({"sampling": {"top_p": 2.0}}, "top_p"),
    ({"harness": []}, "at least one harness"),
])
def test_bad_values_are_refused_with_what_to_fix(settings, message):
    with pytest.raises(EpisodeConfigError, match=message):
        EpisodeConfig(**settings)


def test_every_entry_point_gets_the_same_defaults_and_the_one_default_sandbox():
    env = gym.make("HarnessSWE-v0")
    vec = gym.make_vec("HarnessSWE-v0", num_envs=2, vectorization_mode="vector_entry_point")
    rollout = make_rollout_func()
    try:
        configs = [env.unwrapped.config, vec.unwrapped.config, rollout.config]
        for config in configs:
            assert config.sandbox is None  # harness_gym.sandbox.default_sandbox(), at start
        shared = [dataclasses.replace(c, progress=True) for c in configs]
        assert [[getattr(c, s) for s in SETTINGS if s != "harness"] for c in shared] == \
            [[getattr(shared[0], s) for s in SETTINGS if s != "harness"]] * 3
    finally:
        env.close()
        vec.close()
        rollout.close()


def test_trl_users_can_set_every_episode_setting():
    rollout = make_rollout_func(context_overflow="truncate", sandbox="local",
                                reward={"tool_penalty": 0.05})
    assert rollout.config.context_overflow == "truncate"
    assert rollout.config.sandbox == "local" and rollout.config.reward.tool_penalty == 0.05


def test_a_config_is_frozen_and_its_copies_are_validated_again():
    config = EpisodeConfig(engine="oracle", sampling={"temperature": 0.5})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.engine = "tiny"  # type: ignore[misc]
    assert config.replace(test_timeout_s=5).test_timeout_s == 5.0
    with pytest.raises(EpisodeConfigError, match="must be positive"):
        config.replace(test_timeout_s=-1)
    env = gym.make("HarnessSWE-v0", config=config, episode_timeout_s=30)
    try:
        assert env.unwrapped.config == config.replace(episode_timeout_s=30)
    finally:
        env.close()


def test_a_single_env_runs_one_harness():
    with pytest.raises(EpisodeConfigError, match="make_vec"):
        gym.make("HarnessSWE-v0", harness=["pi", "hermes"], engine="oracle")
