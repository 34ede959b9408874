"""The RL wrappers, on a vector env that replays given episode outcomes.

The wrappers only read `rewards` and batched `infos`, so these tests feed them chosen numbers
through `ReplayedEpisodes` (real batching, `harness_gym.vector_env.batch_infos`); the end-to-end
stack on real Pi episodes is in test_vector_env.py.
"""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pyarrow.parquet as pq
from harness_gym.runs.trace_view import load_episodes
import pytest
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from harness_gym.wrappers import (
    DropInfraErrors,
    GroupRelativeAdvantage,
    RecordTraces,
    StalenessFilter,
    group_advantages,
)

from harness_gym.env import ACTION_SPACE, AnyText
from harness_gym.trace import SEGMENT_SCHEMA, CallSampling, TraceSegment, normalize_segment
from harness_gym.vector_env import batch_infos


def segment(version: int, n: int = 3) -> dict:
    return TraceSegment("agent", [1, 2, *range(n)], 2, loss_mask=[1] * n,
                        response_logprobs=[-0.5] * n, policy_versions=[version]).to_dict()


def unusual_segment() -> dict:
    """Every field away from its default: a forked, aborted auxiliary segment of two calls,
    sampled differently (the second with a seed and a forced tool-call prefix), linked to a
    tool call."""
    return TraceSegment("auxiliary", [5, 6, 7, 8, 9], 2, loss_mask=[1, 0, 1],
                        response_logprobs=[-0.25, 0.0, -1.5], policy_versions=[4, 3],
                        sampling=[CallSampling(0.7, 0.95, 40, 256), CallSampling(1.0, 1.0, 0, 17, 3)],
                        call_starts=[0, 1], forced_tokens=[0, 2], incomplete=True, parent=0,
                        parent_call_id="call_1").to_dict()


def episode(task: str, outcome: str = "passed", version: int | None = 0) -> dict:
    return {"task_id": task, "harness": "pi", "outcome": outcome,
            "reward_breakdown": {"outcome": outcome, "drop": outcome == "infra_error"},
            "n_llm_calls": 2, "n_tool_calls": 1, "tests": {f"{task}::t": "PASSED"},
            "patch": "", "trace": [] if version is None else [segment(version)],
            "policy_version_min": version, "policy_version_max": version,
            "duration_s": 1.0, "error": None, "model": "tiny", "tokenizer": "tiny"}


class ReplayedEpisodes(VectorEnv):
    """Each step returns the next (rewards, episode infos) pair it was given."""

    metadata: ClassVar[dict] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, steps: list[tuple[list[float], list[dict]]], group_size: int = 2) -> None:
        self.steps = list(steps)
        self.num_envs = len(steps[0][0])
        self.group_size = group_size
        self.single_observation_space = AnyText(100)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.single_action_space = ACTION_SPACE
        self.action_space = batch_space(ACTION_SPACE, self.num_envs)
        self.closed_count = 0

    def reset(self, *, seed=None, options=None):
        return ("task",) * self.num_envs, {}

    def step(self, actions):
        rewards, infos = self.steps.pop(0)
        n = self.num_envs
        return (("task",) * n, np.array(rewards, dtype=np.float64), np.ones(n, bool),
                np.zeros(n, bool), batch_infos(infos))

    def close_extras(self, **kwargs):
        self.closed_count += 1


def test_group_relative_advantage_normalizes_within_each_group():
    rewards = [1.0, 0.0, 0.5, 0.5, 0.9, 0.6, 0.0, 0.0]
    env = GroupRelativeAdvantage(
        ReplayedEpisodes([(rewards, [episode("a")] * 8)], group_size=4), eps=1e-6)
    _, _, _, _, infos = env.step(None)
    first = np.array([1.0, 0.0, 0.5, 0.5])  # mean 0.5, population std sqrt(0.125)
    second = np.array([0.9, 0.6, 0.0, 0.0])  # mean 0.375, population std sqrt(0.151875)
    expected = np.concatenate([(first - 0.5) / (np.sqrt(0.125) + 1e-6),
                               (second - 0.375) / (np.sqrt(0.151875) + 1e-6)])
    np.testing.assert_allclose(infos["advantage"], expected, rtol=1e-12)
    assert infos["_advantage"].all() and not infos["group_all_equal"].any()


def test_a_group_of_equal_rewards_has_zero_advantage_and_is_flagged():
    env = GroupRelativeAdvantage(ReplayedEpisodes([([1.0, 1.0, 0.0, 1.0], [episode("a")] * 4)]))
    _, _, _, _, infos = env.step(None)
    assert infos["advantage"][:2].tolist() == [0.0, 0.0]
    assert infos["group_all_equal"].tolist() == [True, True, False, False]
    assert infos["advantage"][2] == pytest.approx(-1.0, abs=1e-5)


def test_dropped_episodes_are_left_out_of_the_group_baseline():
    infos = [episode("a"), episode("a", "infra_error"), episode("a"), episode("a", "failed")]
    env = GroupRelativeAdvantage(ReplayedEpisodes([([1.0, 0.0, 1.0, 0.0], infos)], group_size=4))
    _, _, _, _, out = env.step(None)
    assert out["advantage"][1] == 0.0  # dropped: no signal, and not in the mean
    mean, std = np.mean([1.0, 1.0, 0.0]), np.std([1.0, 1.0, 0.0])
    np.testing.assert_allclose(out["advantage"][[0, 2, 3]],
                               (np.array([1.0, 1.0, 0.0]) - mean) / (std + 1e-6))
    np.testing.assert_allclose(group_advantages(np.array([2.0, 4.0]), 2)[0], [-1, 1], atol=1e-5)


@pytest.mark.parametrize("mode", ["drop", "mask"])
def test_staleness_filter_flags_exactly_the_episodes_lagging_by_more_than_max_lag(mode):
    versions = [7, 6, 5, 4, None, 8]  # lags 0, 1, 2, 3, no calls, ahead
    infos = [episode(f"t{i}", version=v) for i, v in enumerate(versions)]
    env = StalenessFilter(ReplayedEpisodes([([1.0] * 6, infos)]), current_version=lambda: 7,
                          max_lag=1, mode=mode)
    _, _, _, _, out = env.step(None)
    stale = [False, False, True, True, False, False]
    assert out["stale"].tolist() == stale
    assert [all(m == 0 for s in t for m in s["loss_mask"]) and bool(t) for t in out["trace"]] == stale
    assert out.get("drop", np.zeros(6, bool)).tolist() == (stale if mode == "drop" else [False] * 6)
    assert infos[2]["trace"][0]["loss_mask"] == [1, 1, 1]  # masked on copies, not in place


def test_drop_infra_errors_flags_them_and_can_omit_their_traces():
    infos = [episode("a"), episode("a", "infra_error"), episode("b", "failed"), episode("b")]
    env = DropInfraErrors(ReplayedEpisodes([([1.0, 0.0, 0.0, 1.0], infos)]), omit=True)
    _, _, _, _, out = env.step(None)
    assert out["drop"].tolist() == [False, True, False, False]
    assert out["trace"][1] == [] and len(out["trace"][0]) == 1


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_record_traces_round_trips_every_episode(tmp_path, fmt):
    first = [episode(f"t{i}", version=i) for i in range(4)]
    second = [episode(f"u{i}", "failed", version=None) for i in range(4)]
    inner = ReplayedEpisodes([([1.0] * 4, first), ([0.0] * 4, second)])
    env = RecordTraces(GroupRelativeAdvantage(inner), tmp_path / "runs", format=fmt)
    env.step(None)
    env.step(None)
    env.close()
    assert inner.closed_count == 1 and env.file.suffix == f".{fmt}"
    if fmt == "parquet":
        rows = pq.read_table(env.file).to_pylist()
    else:
        rows = [json.loads(line) for line in env.file.read_text().splitlines()]
    assert [(r["step"], r["env_index"], r["task_id"]) for r in rows] == \
        [(s, i, f"{p}{i}") for s, p in enumerate("tu") for i in range(4)]
    assert rows[1]["trace"] == [segment(1)] and rows[5]["trace"] == []
    assert rows[1]["advantage"] == 0.0 and rows[1]["stale"] is None
    assert rows[1]["policy_version_min"] == 1 and rows[5]["policy_version_min"] is None
    assert json.loads(rows[0]["tests"]) == {"t0::t": "PASSED"}
    assert json.loads(rows[4]["reward_breakdown"]) == {"outcome": "failed", "drop": False}
    assert rows[0]["model"] == "tiny" and rows[0]["tokenizer"] == "tiny"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_record_traces_keeps_every_segment_field(tmp_path, fmt):
    written = [segment(0), unusual_segment()]
    assert list(written[1]) == list(SEGMENT_SCHEMA)
    first = [{**episode(f"t{i}"), "trace": written} for i in range(4)]
    env = RecordTraces(ReplayedEpisodes([([1.0] * 4, first)]), tmp_path / "runs", format=fmt)
    env.step(None)
    env.close()
    if fmt == "parquet":
        rows = pq.read_table(env.file).to_pylist()
    else:
        rows = [json.loads(line) for line in env.file.read_text().splitlines()]
    assert rows[0]["trace"] == written
    assert load_episodes(env.file)[0]["trace"] == written
    assert rows[0]["trace"][1]["sampling_temperature"] == [0.7, 1.0]
    assert rows[0]["trace"][1]["sampling_seed"] == [None, 3]


def test_a_segment_from_before_sampling_was_recorded_reads_back_with_one_null_per_call():
    old = {k: v for k, v in unusual_segment().items()
           if not k.startswith("sampling_") and k != "call_starts"}
    read = normalize_segment(old)
    assert list(read) == list(SEGMENT_SCHEMA)
    assert read["sampling_temperature"] == [None, None] and read["call_starts"] == [None, None]
