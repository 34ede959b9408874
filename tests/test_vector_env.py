"""`make_vec("HarnessSWE-v0")`: real Pi episodes on one proxy and one engine, run concurrently.

One module-scoped step of the whole wrapper stack (4 Pi + oracle episodes, 2 GRPO groups) backs
most tests here; each oracle episode takes a few seconds, so the module stays short.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
from gymnasium.vector import AutoresetMode
from harness_gym.wrappers import (
    DropInfraErrors,
    GroupRelativeAdvantage,
    RecordTraces,
    StalenessFilter,
)

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines.oracle import OracleEngine
from harness_gym.harness import HarnessOutput, HarnessSpec, LaunchPlan, Package
from harness_gym.vector_env import HarnessVectorEnv

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")

VERSIONS = np.array([5, 4, 3, 2])  # lags 0, 1, 2, 3 behind version 5


def make_vec(tiny, **kwargs):
    kwargs = {"num_envs": 4, "group_size": 2, "harness": "pi", "progress": False, **kwargs}
    return gym.make_vec("HarnessSWE-v0", vectorization_mode="vector_entry_point",
                        engine=OracleEngine(tiny), **kwargs)


@pytest.fixture(scope="module")
def stepped(tiny, tmp_path_factory):
    """The whole stack, one reset and one timed step; then closed."""
    vec = make_vec(tiny)
    envs = RecordTraces(GroupRelativeAdvantage(StalenessFilter(vec, current_version=5,
                                                               max_lag=1)),
                        tmp_path_factory.mktemp("runs"), format="parquet")
    try:
        problems, reset_infos = envs.reset(seed=0)
        started = time.perf_counter()
        result = envs.step({"policy_version": VERSIONS, "temperature": np.ones(4, np.float32)})
        wall = time.perf_counter() - started
        (runner,) = vec._executor.stack.runners.values()
    finally:
        envs.close()
    return {"vec": vec, "runner": runner, "problems": problems, "reset_infos": reset_infos, "wall": wall,
            "step": result, "file": envs.file}


def test_make_vec_builds_a_same_step_vector_env_with_batched_spaces(stepped):
    vec = stepped["vec"]
    assert isinstance(vec, HarnessVectorEnv) and vec.num_envs == 4 and vec.closed
    assert vec.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert vec.observation_space.contains(stepped["problems"])
    assert vec.action_space.contains({"policy_version": VERSIONS,
                                      "temperature": np.ones(4, np.float32)})


def test_close_stops_the_proxy_and_removes_the_materialized_repos(stepped):
    runner = stepped["runner"]
    assert not runner._repos.exists()
    with pytest.raises(httpx.TransportError):
        httpx.get(runner.proxy.url + "/health", timeout=2)
    assert stepped["vec"]._executor is None


def test_each_group_shares_its_task_and_its_rewards(stepped):
    task_ids = stepped["reset_infos"]["task_id"].tolist()
    assert task_ids[0] == task_ids[1] and task_ids[2] == task_ids[3] and task_ids[0] != task_ids[2]
    assert stepped["problems"][0] == stepped["problems"][1]
    _, rewards, terminations, truncations, infos = stepped["step"]
    assert infos["task_id"].tolist() == task_ids and infos["outcome"].tolist() == ["passed"] * 4
    assert rewards.dtype == np.float64 and rewards[0] == rewards[1] and rewards[2] == rewards[3]
    assert terminations.all() and not truncations.any()


def test_the_episodes_of_a_step_run_at_the_same_time(stepped):
    infos = stepped["step"][4]
    assert stepped["wall"] < 0.75 * infos["duration_s"].sum()


def test_every_trace_holds_its_own_task_and_no_other(stepped, tiny):
    problems, infos = stepped["problems"], stepped["step"][4]
    for i, trace in enumerate(infos["trace"]):
        (segment,) = trace
        text = tiny.tokenizer.decode(segment["prompt_ids"] + segment["response_ids"])
        assert problems[i].strip()[:200] in text
        assert all(p.strip()[:200] not in text for p in set(problems) - {problems[i]})
        assert infos["final_obs"][i] == problems[i]


def test_same_step_autoreset_hands_back_the_next_tasks(stepped):
    next_problems, _, _, _, infos = stepped["step"]
    next_ids = infos["next_task_id"].tolist()
    assert next_ids[0] == next_ids[1] and next_ids[2] == next_ids[3]
    assert len(next_problems) == 4 and next_problems[0] == next_problems[1]


def test_each_episode_records_the_policy_version_its_action_gave(stepped):
    infos = stepped["step"][4]
    assert infos["policy_version_min"].tolist() == VERSIONS.tolist()
    assert infos["policy_version_max"].tolist() == VERSIONS.tolist()
    assert [t[0]["policy_version"] for t in infos["trace"]] == VERSIONS.tolist()


def test_staleness_filter_with_max_lag_1_drops_exactly_the_episodes_two_versions_behind(stepped):
    infos = stepped["step"][4]
    assert infos["stale"].tolist() == [False, False, True, True]
    assert infos["drop"].tolist() == [False, False, True, True]
    assert [any(t[0]["loss_mask"]) for t in infos["trace"]] == [True, True, False, False]
    assert infos["group_all_equal"].tolist() == [True] * 4  # every oracle episode passed
    assert infos["advantage"].tolist() == [0.0] * 4


def test_record_traces_writes_the_step_to_parquet(stepped):
    rows = pq.read_table(stepped["file"]).to_pylist()
    infos = stepped["step"][4]
    assert [r["task_id"] for r in rows] == infos["task_id"].tolist()
    assert [r["stale"] for r in rows] == [False, False, True, True]
    assert [r["trace"][0]["response_ids"] for r in rows] == \
        [t[0]["response_ids"] for t in infos["trace"]]


class QuitsAtOnce(HarnessSpec):
    """A harness that exits at once without touching the repo."""

    name = "quits-at-once"
    package = Package("npm", "quits-at-once-test-only", "0.0.0", bin="quit")
    dialect = "openai-chat"
    shell_tool = "bash"

    def install(self, cache_dir=None, progress=None):
        return Path(tempfile.gettempdir())

    def prepare(self, sandbox, endpoint, prompt, cache_dir=None) -> LaunchPlan:
        return LaunchPlan(argv=["true"])

    def args(self, endpoint, prompt):
        return []

    def parse_output(self, stdout: str) -> HarnessOutput:
        return HarnessOutput(None, None, stdout[-200:])


def test_one_vector_env_runs_several_harnesses_and_says_which_ran(tiny, tmp_path):
    envs = RecordTraces(DropInfraErrors(make_vec(tiny, num_envs=2, group_size=2,
                                                 harness=["pi", QuitsAtOnce()],
                                                 mix_harnesses=True)),
                        tmp_path, format="jsonl")
    envs.unwrapped.set_policy_version(9)
    try:
        _, reset_infos = envs.reset(seed=1)
        _, rewards, _, _, infos = envs.step(None)
    finally:
        envs.close()
    assert reset_infos["harness"].tolist() == infos["harness"].tolist() == ["pi", "quits-at-once"]
    assert infos["outcome"].tolist() == ["passed", "failed"] and rewards[0] > rewards[1]
    assert infos["policy_version_max"][0] == 9 and infos["trace"][1] == []
    assert infos["drop"].tolist() == [False, False]
    rows = [json.loads(line) for line in envs.file.read_text().splitlines()]
    assert [(r["harness"], r["outcome"]) for r in rows] == [("pi", "passed"),
                                                            ("quits-at-once", "failed")]


def test_a_reinforce_step_from_the_gymnasium_api_sees_ratios_of_one(tiny):
    envs = GroupRelativeAdvantage(make_vec(tiny))
    try:
        envs.reset(seed=2)
        losses = []
        for version in range(1):  # one update's worth: weights do not change in this test
            *_, infos = envs.step({"policy_version": np.full(4, version)})
            for advantage, trace in zip(infos["advantage"], infos["trace"]):
                for segment in trace:
                    mask = np.asarray(segment["loss_mask"], dtype=bool)
                    p_old = np.asarray(segment["response_logprobs"])
                    new = np.asarray(tiny.score(segment["prompt_ids"], segment["response_ids"]))
                    ratio = np.exp(new - p_old)[mask]
                    np.testing.assert_allclose(ratio, 1.0, atol=1e-4)
                    losses.append(-(advantage * ratio).sum() / max(mask.sum(), 1))
        assert losses and np.isfinite(losses).all()
    finally:
        envs.close()


def test_bad_vector_arguments_get_clear_errors(tiny):
    with pytest.raises(ValueError, match="multiple of group_size"):
        make_vec(tiny, num_envs=3, group_size=2)
    envs = make_vec(tiny, num_envs=2, group_size=1)
    try:
        with pytest.raises(gym.error.ResetNeeded):
            envs.step(None)
        with pytest.raises(ValueError, match="one task per group"):
            envs.reset(options={"task_ids": ["x"]})
    finally:
        envs.close()
