"""Dynamic sampling for GRPO: groups whose rewards are all equal teach nothing, so refill them.

A GRPO group's advantages are its rewards minus their mean: a group where every rollout scored
the same (all passed with the same tool count, all failed) has zero advantage everywhere and
only dilutes the batch. `refill_groups` takes one rollout batch (rows in runs of `group`
identical tasks, as `make_rollout_func` builds them), replaces each zero-variance group by a
group of a newly drawn task that does have a reward spread, drawing at most `max_extra_draws`
new groups in all, and takes every zero-variance group still left out of the loss (its
`env_mask` all 0: it keeps its rows, because TRL wants one row per prompt, and adds no
gradient). The counts of what happened come back with the rows:

    kept                   groups trained on (with a reward spread), refills included
    dropped_zero_variance  zero-variance groups seen, the batch's and the drawn ones
    refilled               batch groups replaced by a drawn group
    masked                 zero-variance groups left in the batch, out of the loss
    extra_draws            new groups run (<= max_extra_draws)

A refilled row is another task's episode than the prompt TRL sampled: its `task_id` says which
(TRL trains on the rows' own `prompt_ids`, and `harness_reward` reads the rows' `reward`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DynamicSampling", "refill_groups", "zero_variance_groups"]

Rows = dict[str, list[Any]]


@dataclass(frozen=True)
class DynamicSampling:
    """`max_extra_draws`: new groups a batch may run beyond its own; `tolerance`: a group whose
    rewards span no more than this counts as zero-variance; `seed`: which tasks are drawn."""

    max_extra_draws: int = 4
    tolerance: float = 1e-9
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_extra_draws < 0:
            raise ValueError(f"max_extra_draws must be >= 0, got {self.max_extra_draws}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")


def zero_variance_groups(rewards: Sequence[float], group: int, tolerance: float = 1e-9
                         ) -> list[int]:
    """Indices of the groups (runs of `group` rows) whose rewards are all equal."""
    if group < 1 or len(rewards) % group:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group}")
    return [g for g in range(len(rewards) // group)
            if max(rewards[g * group:(g + 1) * group])
            - min(rewards[g * group:(g + 1) * group]) <= tolerance]


def refill_groups(
    rows: Rows,
    group: int,
    candidates: Sequence[Any],
    run: Callable[[list[Any]], Rows],
    settings: DynamicSampling,
    *,
    step: int = 0,
) -> tuple[Rows, dict[str, int]]:
    """`rows` with its zero-variance groups replaced (see the module docstring).
    `candidates` are the tasks a refill may draw (drawn without replacement, in an order fixed
    by `settings.seed` and `step`); `run(tasks)` runs one group per task and returns their rows
    in the same layout (each task's `group` rows in a run)."""
    rows = {key: list(values) for key, values in rows.items()}
    n_groups = len(rows["reward"]) // group
    flat = zero_variance_groups(rows["reward"], group, settings.tolerance)
    stats = {"groups": n_groups, "kept": n_groups - len(flat), "dropped_zero_variance": len(flat),
             "refilled": 0, "masked": 0, "extra_draws": 0}
    pool = list(candidates)
    random.Random(f"dynamic-sampling:{settings.seed}:{step}").shuffle(pool)
    while flat and stats["extra_draws"] < settings.max_extra_draws and pool:
        k = min(len(flat), settings.max_extra_draws - stats["extra_draws"], len(pool))
        drawn, pool = pool[:k], pool[k:]
        stats["extra_draws"] += k
        new = run(drawn)
        spread = set(range(k)) - set(zero_variance_groups(new["reward"], group,
                                                           settings.tolerance))
        stats["dropped_zero_variance"] += k - len(spread)
        for j in sorted(spread):
            g = flat.pop(0)
            for key, values in rows.items():
                values[g * group:(g + 1) * group] = new[key][j * group:(j + 1) * group]
            stats["refilled"] += 1
            stats["kept"] += 1
    for g in flat:  # out of the loss: no token of the group counts
        for i in range(g * group, (g + 1) * group):
            rows["env_mask"][i] = [0] * len(rows["env_mask"][i])
    stats["masked"] = len(flat)
    return rows, stats
