"""Running episodes from the command line and writing their traces to disk.

One run writes one JSON Lines file, one line per episode: the env's `info` (trace included, as
plain lists) plus `reward`. Lines are flushed as episodes finish, so a long run can be read
while it goes. While an episode runs, the progress bar shows its model calls live (calls,
tokens sampled, tokens/s), fed by the proxy's `on_progress` observer: an episode of a slow
model on a CPU takes minutes, and a bar that sits at 0% for them looks frozen.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..env import HarnessSWEEnv
from ..proxy import CallProgress


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


class CallMeter:
    """Model-call progress as one short line: `3 calls, 812 tokens, 18.1 tok/s`.

    Fed `CallProgress` reports from the proxy's thread; `show` receives the line at each call's
    start and end, and at most every `interval_s` in between. The rate is the newest call's
    decoding speed (tokens after its first over the time since); before its first token the
    line says it is reading the prompt (a long prefill on a CPU takes a while).
    """

    def __init__(self, show: Callable[[str], None], *, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._show = show
        self._clock = clock
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._live: dict[str, CallProgress] = {}  # by session: the call in flight
        self._first_token: dict[str, tuple[float, int]] = {}  # by session: (time, tokens)
        self._last: CallProgress | None = None
        self._rate: float | None = None
        self._shown_at = 0.0
        self.calls = 0
        self.tokens = 0  # sampled by finished calls

    def __call__(self, progress: CallProgress) -> None:
        now = self._clock()
        with self._lock:
            session = progress.session_id
            starting = session not in self._live and not progress.finished
            if starting:
                self._first_token.pop(session, None)
            if progress.completion_tokens and session not in self._first_token:
                self._first_token[session] = (now, progress.completion_tokens)
            since, base = self._first_token.get(session, (now, 0))
            if now > since:
                self._rate = (progress.completion_tokens - base) / (now - since)
            if progress.finished:
                self._live.pop(session, None)
                self._first_token.pop(session, None)
                self.calls += 1
                self.tokens += progress.completion_tokens
            else:
                self._live[session] = progress
            self._last = progress
            if not (starting or progress.finished or now - self._shown_at >= self._interval_s):
                return
            self._shown_at = now
            line = self.line()
        self._show(line)

    def line(self) -> str:
        last = self._last
        if last is None:
            return "waiting for the first model call"
        calls = self.calls + len(self._live)
        tokens = self.tokens + sum(p.completion_tokens for p in self._live.values())
        if not last.finished and last.completion_tokens == 0:
            state = f"reading a {last.prompt_tokens:,}-token prompt"
        elif self._rate is None:
            state = "sampling"
        else:
            state = f"{self._rate:.1f} tok/s"
        return f"{calls} call{'s' if calls != 1 else ''}, {tokens:,} tokens, {state}"


def episode_task_ids(
    task_ids: Sequence[str], suite: Sequence[str], episodes: int, seed: int
) -> list[str]:
    """The task of each episode: the named ones in turn, else the suite shuffled by `seed`, so a
    run of N episodes visits N different tasks before any comes again.

    >>> episode_task_ids([], ["a", "b", "c"], 5, seed=0)
    ['b', 'c', 'a', 'b', 'c']
    >>> episode_task_ids(["b"], ["a", "b", "c"], 2, seed=0)
    ['b', 'b']
    """
    order = list(task_ids) or random.Random(seed).sample(list(suite), len(suite))
    return [order[index % len(order)] for index in range(episodes)]


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
    bar = tqdm(total=episodes, desc="episodes", unit="ep", disable=not progress,
               bar_format="{desc} {n_fmt}/{total_fmt} [{elapsed}]{postfix}")
    settings = env.proxy.app.settings
    observer, settings.on_progress = settings.on_progress, None
    if progress:
        settings.on_progress = CallMeter(lambda line: bar.set_postfix_str(line))
    try:
        chosen = episode_task_ids(task_ids, [t.instance_id for t in env.tasks], episodes, seed)
        with path.open("w") as out:
            for index, task_id in enumerate(chosen):
                env.reset(seed=seed + index, options={"task_id": task_id})
                _, reward, _, _, info = env.step(None)
                record = {"episode": index, "reward": reward, **info}
                out.write(json.dumps(record) + "\n")
                out.flush()
                summary.outcomes[info["outcome"]] += 1
                summary.rewards.append(reward)
                summary.episodes.append(record)
                if progress:
                    bar.write(f"  episode {index}: {info['task_id']} {info['outcome']} "
                              f"reward={reward:.3f} llm_calls={info['n_llm_calls']} "
                              f"tool_calls={info['n_tool_calls']} segments={len(info['trace'])}")
                bar.update()
    finally:
        settings.on_progress = observer
        bar.close()
    return summary
