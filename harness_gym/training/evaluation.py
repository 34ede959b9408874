"""Running a policy over a task list through the env, and the statistics a learning curve reports.

`run_tasks` runs each task once through a harness (a vector env, `num_envs` episodes at a time),
records every episode with `RecordTraces` and returns the episodes' infos. `summarize` turns them
into the figures of one checkpoint: pass@1 with a Wilson interval, mean tool calls on solved
instances with a bootstrap interval, outcome counts.

    >>> s = summarize([{"outcome": "passed", "n_tool_calls": 2}, {"outcome": "passed",
    ...                 "n_tool_calls": 4}, {"outcome": "failed", "n_tool_calls": 9},
    ...                {"outcome": "infra_error", "n_tool_calls": 0}])
    >>> s["pass_at_1"], s["n_scored"], s["outcomes"]["infra_error"], s["tool_calls_solved"]
    (0.6666666666666666, 3, 1, 3.0)
    >>> [round(x, 3) for x in wilson_interval(2, 3)]
    [0.208, 0.939]
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from ..config import EpisodeConfig
from ..rewards import OUTCOMES
from ..tasks.task import Task

__all__ = ["EPISODE_FIELDS", "bootstrap_interval", "recorded_episodes", "run_tasks", "summarize",
           "wilson_interval"]

#: Outcomes that say nothing about the policy (the grader or sandbox failed): left out of pass@1.
UNSCORED = ("infra_error",)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (sound at 0, 1 and small n, where the
    normal approximation gives intervals outside [0, 1] or of zero width)."""
    if n <= 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95, *,
                       resamples: int = 10_000, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean; None without values."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return (float(low), float(high))


def summarize(episodes: Sequence[Mapping[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """The figures of one evaluation (see the module docstring). pass@1 counts every episode but
    `infra_error` ones (reported in `outcomes`), each task run once."""
    outcomes = Counter({name: 0 for name in OUTCOMES})
    outcomes.update(str(e["outcome"]) for e in episodes)
    scored = [e for e in episodes if e["outcome"] not in UNSCORED]
    passed = [e for e in scored if e["outcome"] == "passed"]
    tools_solved = [float(e["n_tool_calls"]) for e in passed]
    n = len(scored)
    return {
        "n_episodes": len(episodes),
        "n_scored": n,
        "n_passed": len(passed),
        "pass_at_1": len(passed) / n if n else 0.0,
        "pass_at_1_ci": list(wilson_interval(len(passed), n, confidence)),
        "tool_calls_solved": float(np.mean(tools_solved)) if tools_solved else None,
        "tool_calls_solved_ci": _listed(bootstrap_interval(tools_solved, confidence)),
        "tool_calls_all": float(np.mean([e["n_tool_calls"] for e in scored])) if scored else None,
        "outcomes": dict(outcomes),
        "confidence": confidence,
        "solved_task_ids": sorted(str(e["task_id"]) for e in passed if "task_id" in e),
    }


def run_tasks(
    tasks: Sequence[Task],
    config: EpisodeConfig,
    *,
    out_dir: str | Path,
    num_envs: int = 1,
    progress: bool = True,
    resume: bool = False,
) -> list[dict[str, Any]]:
    """Each task once through the env described by `config` (its engine, harness, sandbox,
    sampling), `num_envs` episodes at a time; every episode recorded by `RecordTraces` under
    `out_dir` (JSON Lines). Returns one dict per episode, in task order: the info fields a
    summary needs (`EPISODE_FIELDS`).

    With `resume`, episodes already recorded under `out_dir` (by an earlier call that was cut
    short) count as done and only the other tasks run, so a killed run loses at most the
    `num_envs` episodes it had in flight."""
    import gymnasium as gym
    from tqdm import tqdm

    import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

    from ..wrappers import RecordTraces

    tasks = list(tasks)
    done = {e["task_id"]: e for e in recorded_episodes(out_dir)} if resume else {}
    todo = [t for t in tasks if t.instance_id not in done]
    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc="episodes", unit="ep",
               disable=not progress)
    envs: dict[int, Any] = {}
    try:
        for start in range(0, len(todo), num_envs):
            chunk = todo[start:start + num_envs]
            if len(chunk) not in envs:  # a shorter last chunk gets its own env
                vec = gym.make_vec("HarnessSWE-v0", num_envs=len(chunk),
                                   vectorization_mode="vector_entry_point", tasks=tasks,
                                   config=config)
                envs[len(chunk)] = RecordTraces(vec, out_dir)
            env = envs[len(chunk)]
            env.reset(options={"task_ids": [t.instance_id for t in chunk]})
            _, rewards, _, _, infos = env.step(None)
            for i in range(len(chunk)):
                done[str(infos["task_id"][i])] = {
                    "task_id": str(infos["task_id"][i]), "outcome": str(infos["outcome"][i]),
                    "reward": float(rewards[i]), "n_tool_calls": int(infos["n_tool_calls"][i]),
                    "n_llm_calls": int(infos["n_llm_calls"][i]),
                    "duration_s": float(infos["duration_s"][i]),
                    "error": _text(infos, "error", i),
                }
            bar.update(len(chunk))
            bar.set_postfix_str(summary_line(list(done.values())))
    finally:
        bar.close()
        for env in envs.values():
            env.close()
    return [done[t.instance_id] for t in tasks if t.instance_id in done]


#: The fields of an episode `run_tasks` returns (RecordTraces rows carry them under these names).
EPISODE_FIELDS = ("task_id", "outcome", "reward", "n_tool_calls", "n_llm_calls", "duration_s",
                  "error")


def recorded_episodes(out_dir: str | Path) -> list[dict[str, Any]]:
    """The episodes RecordTraces JSON Lines files under `out_dir` hold (`EPISODE_FIELDS` of each).

    A process killed while writing leaves at most a torn last line: it is cut off the file (that
    row's episode runs again), so the directory stays readable by `harness_gym.training.sft`."""
    episodes: list[dict[str, Any]] = []
    directory = Path(out_dir)
    for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
        data = path.read_bytes()
        whole = 0  # bytes of complete rows
        for line in data.splitlines(keepends=True):
            try:
                row = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:
                row = None
            if row is None:
                break  # a torn write: the last thing the killed process did
            episodes.append({k: row.get(k) for k in EPISODE_FIELDS})
            whole += len(line)
        if whole < len(data):
            with path.open("r+b") as f:
                f.truncate(whole)
    return episodes


def summary_line(episodes: Sequence[Mapping[str, Any]]) -> str:
    counts = Counter(e["outcome"] for e in episodes)
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def _text(infos: Mapping[str, Any], key: str, i: int) -> str | None:
    if key not in infos or not infos.get(f"_{key}", np.ones(i + 1, bool))[i]:
        return None
    value = infos[key][i]
    return None if value is None else str(value)


def _listed(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else list(interval)
