"""The statistics of a checkpoint's evaluation: pass@1 over several samples per instance, the
paired comparison of two checkpoints, the quit rate."""

from __future__ import annotations

import random

import pytest

from harness_gym.training.evaluation import (
    instance_pass_rates,
    paired_difference,
    recorded_episodes,
    summarize,
)


def _episodes(rates: dict[str, float], samples: int, *, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"task_id": task, "outcome": "passed" if rng.random() < rate else "failed",
             "n_tool_calls": 3, "patch": "diff"} for task, rate in rates.items()
            for _ in range(samples)]


def test_pass_at_1_over_samples_is_the_mean_of_the_instances_pass_rates():
    episodes = ([{"task_id": "a", "outcome": "passed"}] * 3 + [{"task_id": "a", "outcome": "failed"}]
                + [{"task_id": "b", "outcome": "failed"}] * 4)
    summary = summarize([dict(e, n_tool_calls=1) for e in episodes])
    assert summary["pass_at_1"] == pytest.approx(0.375)
    assert summary["n_instances"] == 2 and summary["samples_per_instance"] == 4
    assert instance_pass_rates(episodes) == {"a": 0.75, "b": 0.0}


def test_the_interval_over_samples_resamples_instances_not_episodes():
    # 10 instances, 8 samples each: the episodes are not independent, so the interval must be
    # as wide as 10 draws allow, far wider than 80 independent episodes would give.
    rates = {f"t{i}": (1.0 if i < 5 else 0.0) for i in range(10)}
    summary = summarize(_episodes(rates, 8))
    low, high = summary["pass_at_1_ci"]
    assert summary["pass_at_1"] == 0.5
    assert high - low > 0.45  # a Wilson interval on 40/80 would be about 0.22 wide


def test_a_paired_difference_sees_a_gain_unpaired_intervals_would_hide():
    rng = random.Random(1)
    base = {f"t{i}": rng.choice([0.1, 0.3, 0.5, 0.7, 0.9]) for i in range(60)}
    better = {t: min(1.0, r + 0.15) for t, r in base.items()}
    before, after = _episodes(base, 4, seed=2), _episodes(better, 4, seed=3)
    diff = paired_difference(before, after)
    assert diff["n_instances"] == 60
    assert 5 < diff["points"] < 25
    assert diff["ci"][0] > 0  # the paired interval is above zero
    a, b = summarize(before)["pass_at_1_ci"], summarize(after)["pass_at_1_ci"]
    assert a[1] > b[0]  # while the two unpaired intervals overlap


def test_a_paired_difference_uses_only_instances_both_checkpoints_scored():
    before = [{"task_id": "a", "outcome": "failed"}, {"task_id": "b", "outcome": "infra_error"}]
    after = [{"task_id": "a", "outcome": "passed"}, {"task_id": "b", "outcome": "passed"},
             {"task_id": "c", "outcome": "passed"}]
    diff = paired_difference(before, after)
    assert diff["n_instances"] == 1 and diff["points"] == 100.0


def test_the_quit_rate_counts_scored_episodes_that_left_the_repo_unchanged():
    episodes = [{"task_id": "a", "outcome": "failed", "n_tool_calls": 0, "patch": ""},
                {"task_id": "b", "outcome": "failed", "n_tool_calls": 4, "patch": "diff --git"},
                {"task_id": "c", "outcome": "passed", "n_tool_calls": 2, "changed_repo": True},
                {"task_id": "d", "outcome": "infra_error", "n_tool_calls": 0, "patch": ""}]
    assert summarize(episodes)["quit_rate"] == pytest.approx(1 / 3)
    assert summarize([{"outcome": "failed", "n_tool_calls": 0}])["quit_rate"] is None


def test_recorded_episodes_say_whether_the_repo_changed(tmp_path):
    import json

    rows = [{"task_id": "a", "outcome": "failed", "patch": ""},
            {"task_id": "b", "outcome": "passed", "patch": "diff --git a/x b/x"}]
    (tmp_path / "run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [e["changed_repo"] for e in recorded_episodes(tmp_path)] == [False, True]
