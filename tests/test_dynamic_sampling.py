"""Dynamic sampling for GRPO: zero-variance groups are replaced by freshly drawn groups with a
reward spread, at most `max_extra_draws` of them, and whatever stays flat is kept out of the
loss; with counts. The logic on scripted rows, then through `make_rollout_func` with the
oracle on the real Pi CLI (its groups all pass alike: zero variance)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace
from typing import Any

import pytest

from harness_gym.integrations.dynamic_sampling import (
    DynamicSampling,
    refill_groups,
    zero_variance_groups,
)
from harness_gym.integrations.trl import make_rollout_func


def rows_for(tasks: list[str], rewards: list[float], group: int = 2) -> dict[str, list[Any]]:
    ids = [t for t in tasks for _ in range(group)]
    return {"task_id": ids, "reward": list(rewards), "env_mask": [[1, 0, 1] for _ in ids],
            "completion_ids": [[i] for i in range(len(ids))]}


def test_zero_variance_groups_are_the_runs_whose_rewards_are_all_equal():
    assert zero_variance_groups([1, 1, 0, 1, 0.5, 0.5], 2) == [0, 2]
    assert zero_variance_groups([0.9, 0.9 + 1e-12], 2) == [0]
    with pytest.raises(ValueError, match="groups of 2"):
        zero_variance_groups([1, 1, 1], 2)


def test_flat_groups_are_refilled_by_drawn_groups_with_a_spread_and_counted():
    batch = rows_for(["a", "b", "c"], [1, 1, 1, 0, 0, 0])  # a and c flat, b spread
    spread = {"x": [1, 0], "y": [0.95, 0.9], "z": [0, 0]}
    runs: list[list[str]] = []

    def run(drawn: list[str]) -> dict[str, list[Any]]:
        runs.append(drawn)
        return rows_for(drawn, [r for t in drawn for r in spread[t]])

    out, stats = refill_groups(batch, 2, ["x", "y", "z"], run, DynamicSampling(max_extra_draws=5))
    assert sum(len(r) for r in runs) == stats["extra_draws"] <= 3
    assert stats["groups"] == 3 and stats["kept"] == 3 and stats["refilled"] == 2
    assert stats["masked"] == 0
    assert stats["dropped_zero_variance"] == 2 + ("z" in sum(runs, []))
    # the spread group stays where it was; the flat ones now hold drawn groups with a spread
    assert out["task_id"][2:4] == ["b", "b"]
    assert {out["task_id"][0], out["task_id"][4]} == {"x", "y"}
    assert zero_variance_groups(out["reward"], 2) == []
    assert all(mask == [1, 0, 1] for mask in out["env_mask"])
    assert batch["task_id"] == ["a", "a", "b", "b", "c", "c"]  # the input is left as it was


def test_extra_draws_are_bounded_and_what_stays_flat_is_out_of_the_loss():
    batch = rows_for(["a", "b"], [1, 1, 0.5, 0.5])
    drawn: list[str] = []

    def run(tasks: list[str]) -> dict[str, list[Any]]:
        drawn.extend(tasks)
        return rows_for(tasks, [0.0] * 2 * len(tasks))  # every new group flat too

    out, stats = refill_groups(batch, 2, list("pqrstu"), run, DynamicSampling(max_extra_draws=3))
    assert len(drawn) == stats["extra_draws"] == 3
    assert stats == {"groups": 2, "kept": 0, "dropped_zero_variance": 5, "refilled": 0,
                     "masked": 2, "extra_draws": 3}
    assert out["env_mask"] == [[0, 0, 0]] * 4 and out["reward"] == [1, 1, 0.5, 0.5]
    # the draw order is fixed by (seed, step), and differs across steps
    def order(step: int) -> list[str]:
        seen: list[str] = []

        def flat(tasks: list[str]) -> dict[str, list[Any]]:
            seen.extend(tasks)
            return rows_for(tasks, [0.0] * 2 * len(tasks))

        refill_groups(batch, 2, list("pqrstu"), flat, DynamicSampling(max_extra_draws=3),
                      step=step)
        return seen

    assert order(0) == drawn
    assert order(1) != drawn
    # no budget: nothing drawn
    _, none = refill_groups(batch, 2, list("pq"), run, DynamicSampling(max_extra_draws=0))
    assert none["extra_draws"] == 0 and none["masked"] == 2


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_extra_draws"):
        DynamicSampling(max_extra_draws=-1)
    with pytest.raises(ValueError, match="tolerance"):
        DynamicSampling(tolerance=-0.1)


def test_the_rollout_func_refills_flat_oracle_groups_through_pi_and_logs_the_counts():
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    trainer = SimpleNamespace(  # what rollout_func reads of a GRPOTrainer
        model=None, num_generations=2, state=SimpleNamespace(global_step=3),
        args=SimpleNamespace(temperature=1.0, top_p=1.0, top_k=None, max_completion_length=4096))
    with make_rollout_func(harness="pi", engine="oracle", tasks="builtin",
                           dynamic_sampling=1) as rollout:
        task = rollout.tasks[0]
        out = rollout([task.instance_id] * 2, trainer)
        drawn = list(rollout.last_infos["task_id"])
    # the oracle passes every episode alike: the batch's group and the drawn one are flat
    assert out["outcome"] == ["passed", "passed"] and out["task_id"] == [task.instance_id] * 2
    assert rollout.sampling_stats == [{"step": 3, "groups": 1, "kept": 0,
                                       "dropped_zero_variance": 2, "refilled": 0, "masked": 1,
                                       "extra_draws": 1, "batch_passed": 2, "run_episodes": 4,
                                       "run_passed": 4}]
    assert all(set(mask) == {0} for mask in out["env_mask"])  # not trained on
    assert len(set(drawn)) == 1 and drawn[0] != task.instance_id  # a new task was run
