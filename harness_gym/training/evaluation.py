"""Running a policy over a task list through the env, and the statistics a learning curve reports.

`run_tasks` runs each task once through a harness (a vector env, `num_envs` episodes in flight),
records every episode with `RecordTraces` and returns the episodes' infos. `summarize` turns them
into the figures of one checkpoint: pass@1 with a Wilson interval (one sample per instance) or a
bootstrap over instances (several: pass@1 is then the mean over each instance's samples), mean
tool calls on solved episodes with a bootstrap interval, the quit rate (episodes that left the
repo unchanged), outcome counts. `paired_difference` compares two checkpoints on the same
instances by a paired bootstrap: the interval that says whether training helped.

    >>> s = summarize([{"outcome": "passed", "n_tool_calls": 2}, {"outcome": "passed",
    ...                 "n_tool_calls": 4}, {"outcome": "failed", "n_tool_calls": 9},
    ...                {"outcome": "infra_error", "n_tool_calls": 0}])
    >>> s["pass_at_1"], s["n_scored"], s["outcomes"]["infra_error"], s["tool_calls_solved"]
    (0.6666666666666666, 3, 1, 3.0)
    >>> [round(x, 3) for x in wilson_interval(2, 3)]
    [0.208, 0.939]
    >>> before = [{"task_id": t, "outcome": "failed"} for t in "abcd"]
    >>> after = [{"task_id": t, "outcome": "passed" if t in "ab" else "failed"} for t in "abcd"]
    >>> paired_difference(before, after)["points"]
    50.0
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from ..config import EpisodeConfig
from ..rewards import OUTCOMES
from ..tasks.task import Task

__all__ = ["EPISODE_FIELDS", "bootstrap_interval", "instance_pass_rates", "instance_quit_rates",
           "paired_difference", "recorded_episodes", "run_tasks", "summarize", "wilson_interval"]

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


def instance_pass_rates(episodes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each instance's pass rate over its scored samples (`infra_error` ones left out)."""
    return _per_instance(episodes, lambda e: float(e["outcome"] == "passed"))


def instance_quit_rates(episodes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each instance's quit rate over its scored samples that say whether they changed the
    repo (`summarize`'s quit rate, per instance)."""
    def quit(e: Mapping[str, Any]) -> float | None:
        changed = _changed_repo(e)
        return None if changed is None else float(not changed)
    return _per_instance(episodes, quit)


def _per_instance(episodes: Sequence[Mapping[str, Any]],
                  value: Callable[[Mapping[str, Any]], float | None]) -> dict[str, float]:
    """Each instance's mean `value` over its scored samples, those valued None left out."""
    samples: dict[str, list[float]] = {}
    for e in episodes:
        if e["outcome"] not in UNSCORED and (v := value(e)) is not None:
            samples.setdefault(str(e["task_id"]), []).append(v)
    return {task: float(np.mean(values)) for task, values in samples.items()}


RatesByInstance = Callable[[Sequence[Mapping[str, Any]]], dict[str, float]]


def paired_difference(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
                      confidence: float = 0.95, *, resamples: int = 10_000,
                      seed: int = 0, rates: RatesByInstance | None = None) -> dict[str, Any]:
    """pass@1 of `after` minus `before`, in percentage points, over the instances both scored,
    with a paired bootstrap interval (instances resampled, each keeping both of its rates: the
    per-instance difficulty cancels, so the interval is far narrower than two unpaired ones).
    `rates` gives another per-instance rate to compare (`instance_quit_rates`: the quit rate)."""
    rates = instance_pass_rates if rates is None else rates
    a, b = rates(before), rates(after)
    shared = sorted(a.keys() & b.keys())
    diffs = [100.0 * (b[t] - a[t]) for t in shared]
    return {"points": float(np.mean(diffs)) if diffs else 0.0, "n_instances": len(shared),
            "ci": _listed(bootstrap_interval(diffs, confidence, resamples=resamples, seed=seed)),
            "confidence": confidence}


def summarize(episodes: Sequence[Mapping[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """The figures of one evaluation (see the module docstring). pass@1 counts every episode but
    `infra_error` ones (reported in `outcomes`); with several samples of an instance it is the
    mean of the instances' pass rates, its interval a bootstrap over instances (samples of one
    instance are not independent). An episode without `changed_repo` (or a `patch`) is not
    counted for the quit rate."""
    outcomes = Counter({name: 0 for name in OUTCOMES})
    outcomes.update(str(e["outcome"]) for e in episodes)
    scored = [e for e in episodes if e["outcome"] not in UNSCORED]
    passed = [e for e in scored if e["outcome"] == "passed"]
    tools_solved = [float(e["n_tool_calls"]) for e in passed]
    n = len(scored)
    rates = instance_pass_rates(scored) if all("task_id" in e for e in scored) else {}
    several = bool(rates) and len(rates) < n
    if several:
        pass_at_1 = float(np.mean(list(rates.values())))
        interval = bootstrap_interval(list(rates.values()), confidence) or (0.0, 1.0)
    else:
        pass_at_1 = len(passed) / n if n else 0.0
        interval = wilson_interval(len(passed), n, confidence)
    changed = [_changed_repo(e) for e in scored]
    known = [c for c in changed if c is not None]
    return {
        "n_episodes": len(episodes),
        "n_scored": n,
        "n_passed": len(passed),
        "n_instances": len(rates) if rates else n,
        "samples_per_instance": n / len(rates) if rates else 1.0,
        "pass_at_1": pass_at_1,
        "pass_at_1_ci": list(interval),
        "tool_calls_solved": float(np.mean(tools_solved)) if tools_solved else None,
        "tool_calls_solved_ci": _listed(bootstrap_interval(tools_solved, confidence)),
        "tool_calls_all": float(np.mean([e["n_tool_calls"] for e in scored])) if scored else None,
        "quit_rate": (known.count(False) / len(known)) if known else None,
        "outcomes": dict(outcomes),
        "confidence": confidence,
        "solved_task_ids": sorted({str(e["task_id"]) for e in passed if "task_id" in e}),
    }


def _changed_repo(episode: Mapping[str, Any]) -> bool | None:
    if episode.get("changed_repo") is not None:
        return bool(episode["changed_repo"])
    patch = episode.get("patch")
    return None if patch is None else bool(str(patch).strip())


def run_tasks(
    tasks: Sequence[Task],
    config: EpisodeConfig,
    *,
    out_dir: str | Path,
    num_envs: int = 1,
    progress: bool = True,
    resume: bool = False,
    samples: int = 1,
) -> list[dict[str, Any]]:
    """Each task `samples` times through the env described by `config` (its engine, harness,
    sandbox, sampling), `num_envs` episodes in flight at all times (a new one starts as soon as
    one ends: `HarnessVectorEnv.run_continuously`); every episode recorded by `RecordTraces`
    under `out_dir` (JSON Lines) as it finishes. Returns one dict per episode, in task order (a
    task's samples together): the info fields a summary needs (`EPISODE_FIELDS`). Several
    samples of a task want unseeded sampling (the same seed gives a server the same tokens).

    With `resume`, episodes already recorded under `out_dir` (by an earlier call that was cut
    short) count as done and only the missing samples run, so a killed run loses at most the
    `num_envs` episodes it had in flight."""
    import gymnasium as gym
    from tqdm import tqdm

    import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

    from ..vector_env import batch_infos
    from ..wrappers import RecordTraces

    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    tasks = list(tasks)
    done: dict[str, list[dict[str, Any]]] = {}
    for e in recorded_episodes(out_dir) if resume else []:
        done.setdefault(str(e["task_id"]), []).append(e)
    todo = [t for t in tasks for _ in range(samples - len(done.get(t.instance_id, [])[:samples]))]
    bar = tqdm(total=len(tasks) * samples, initial=len(tasks) * samples - len(todo),
               desc="episodes", unit="ep", disable=not progress)
    env = None
    try:
        if todo:
            env = RecordTraces(gym.make_vec("HarnessSWE-v0", num_envs=min(num_envs, len(todo)),
                                            vectorization_mode="vector_entry_point", tasks=tasks,
                                            config=config), out_dir)
            for reward, info in env.unwrapped.run_continuously(todo):
                env.record([reward], batch_infos([info]))
                done.setdefault(str(info["task_id"]), []).append(_episode(reward, info))
                bar.update(1)
                bar.set_postfix_str(summary_line([e for es in done.values() for e in es]))
    finally:
        bar.close()
        if env is not None:
            env.close()
    return [e for t in tasks for e in done.get(t.instance_id, [])[:samples]]


def _episode(reward: float, info: Mapping[str, Any]) -> dict[str, Any]:
    """The `EPISODE_FIELDS` of one finished episode's info."""
    return {"task_id": str(info["task_id"]), "outcome": str(info["outcome"]),
            "reward": float(reward), "n_tool_calls": int(info["n_tool_calls"]),
            "n_llm_calls": int(info["n_llm_calls"]), "duration_s": float(info["duration_s"]),
            "error": None if info.get("error") is None else str(info["error"]),
            "changed_repo": bool((info.get("patch") or "").strip())}


#: The fields of an episode `run_tasks` returns (RecordTraces rows carry them under these names).
EPISODE_FIELDS = ("task_id", "outcome", "reward", "n_tool_calls", "n_llm_calls", "duration_s",
                  "error", "changed_repo")


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
            episode = {k: row.get(k) for k in EPISODE_FIELDS}
            episode["changed_repo"] = _changed_repo(row)
            episodes.append(episode)
            whole += len(line)
        if whole < len(data):
            with path.open("r+b") as f:
                f.truncate(whole)
    return episodes


def summary_line(episodes: Sequence[Mapping[str, Any]]) -> str:
    counts = Counter(e["outcome"] for e in episodes)
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def _listed(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else list(interval)
