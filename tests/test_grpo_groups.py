"""GRPO groups share their prompt: with several harnesses, a group is one task on ONE harness by
default; `mix_harnesses=True` alternates them inside each group.

The env code under test is the real one (`HarnessVectorEnv`, `HarnessRolloutWorker`); only the
executor is a recorder, so what is checked is exactly which (task, harness) pairs each step
submits, without running CLIs.
"""

from __future__ import annotations

from concurrent.futures import Future

import gymnasium as gym
import pytest

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.config import EpisodeConfig, EpisodeConfigError
from harness_gym.episode import EpisodeRequest, EpisodeResult
from harness_gym.integrations.async_grpo import HarnessRolloutWorker


class Recorder:
    """An `ExecutorFactory` whose executor records each request and answers `infra_error`."""

    def __init__(self) -> None:
        self.requests: list[EpisodeRequest] = []
        self.reward = EpisodeConfig(engine="oracle").reward

    def start(self, config: EpisodeConfig, *, max_workers: int) -> Recorder:
        return self

    @property
    def engine(self):  # not needed: no episode runs
        raise AttributeError("engine")

    def submit(self, request: EpisodeRequest) -> Future[EpisodeResult]:
        self.requests.append(request)
        future: Future[EpisodeResult] = Future()
        future.set_result(EpisodeResult.never_ran(request, self.reward, "recorded"))
        return future

    def close(self) -> None:
        pass


def step_requests(**kwargs) -> list[tuple[str, str]]:
    recorder = Recorder()
    envs = gym.make_vec("HarnessSWE-v0", num_envs=8, vectorization_mode="vector_entry_point",
                        group_size=4, harness=["pi", "opencode"], engine="oracle",
                        executor=recorder, progress=False, **kwargs)
    try:
        _, reset_infos = envs.reset(seed=3)
        envs.step(None)
    finally:
        envs.close()
    pairs = [(r.task.instance_id, r.harness) for r in recorder.requests]
    assert [h for _, h in pairs] == reset_infos["harness"].tolist()  # infos say what ran
    return pairs


def groups(pairs: list[tuple[str, str]], size: int = 4) -> list[set[tuple[str, str]]]:
    return [set(pairs[k:k + size]) for k in range(0, len(pairs), size)]


def test_by_default_each_group_is_one_task_on_one_harness():
    pairs = step_requests()
    assert [len(g) for g in groups(pairs)] == [1, 1]  # one (task, harness) per group
    assert [next(iter(g))[1] for g in groups(pairs)] == ["pi", "opencode"]  # both harnesses ran


def test_mix_harnesses_alternates_them_inside_each_group():
    pairs = step_requests(mix_harnesses=True)
    for group in groups(pairs):
        assert {h for _, h in group} == {"pi", "opencode"}
        assert len({t for t, _ in group}) == 1  # still one task per group


def test_fewer_groups_than_harnesses_is_refused_at_make_with_the_way_out():
    with pytest.raises(EpisodeConfigError, match="mix_harnesses=True"):
        gym.make_vec("HarnessSWE-v0", num_envs=4, vectorization_mode="vector_entry_point",
                     group_size=4, harness=["pi", "opencode"], engine="oracle", progress=False)


def test_the_async_rollout_worker_keeps_its_groups_homogeneous_too():
    recorder = Recorder()
    worker = HarnessRolloutWorker("builtin", group_size=3, groups_in_flight=2, engine="oracle",
                                  harness=["pi", "opencode"], executor=recorder)
    worker._executor = recorder  # the worker's own start() would also start its thread
    worker._start_group()
    worker._start_group()
    harnesses = [r.harness for r in recorder.requests]
    assert harnesses == ["pi"] * 3 + ["opencode"] * 3
