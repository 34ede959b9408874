"""Running episodes from the command line and writing their traces to disk.

One run writes one JSON Lines file, one line per episode: the env's `info` (trace included, as
plain lists) plus `reward`. Lines are flushed as episodes finish, so a long run can be read
while it goes.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .env import HarnessSWEEnv


@dataclass
class RunSummary:
    path: Path
    outcomes: Counter = field(default_factory=Counter)
    rewards: list[float] = field(default_factory=list)
    episodes: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        mean = sum(self.rewards) / len(self.rewards) if self.rewards else 0.0
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        return f"{len(self.rewards)} episodes: {counts}; mean reward {mean:.3f}"


def run_episodes(
    env: HarnessSWEEnv,
    *,
    episodes: int,
    out_dir: Path,
    task_ids: Sequence[str] = (),
    seed: int = 0,
    progress: bool = True,
) -> RunSummary:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"episodes-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    summary = RunSummary(path)
    bar = tqdm(total=episodes, desc="episodes", unit="ep", disable=not progress)
    with path.open("w") as out:
        for index in range(episodes):
            options = {"task_id": task_ids[index % len(task_ids)]} if task_ids else None
            env.reset(seed=seed + index, options=options)
            _, reward, _, _, info = env.step(None)
            record = {"episode": index, "reward": reward, **info}
            out.write(json.dumps(record) + "\n")
            out.flush()
            summary.outcomes[info["outcome"]] += 1
            summary.rewards.append(reward)
            summary.episodes.append(record)
            bar.set_postfix_str(f"{info['task_id']}: {info['outcome']}")
            bar.update()
    bar.close()
    return summary
