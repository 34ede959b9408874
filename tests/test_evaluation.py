"""A checkpoint's evaluation: `run_tasks` keeping every sub-env busy (real Pi episodes on the
oracle) and recording each episode once; the statistics: pass@1 over several samples per
instance, the paired comparison of two checkpoints, the quit rate."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import threading
import time
from collections.abc import AsyncIterator, Sequence
from operator import itemgetter
from typing import Any

import gymnasium as gym
import pytest
from harness_gym.tasks.loader import load_tasks

from harness_gym.config import EpisodeConfig
from harness_gym.engines.base import NO_CONTEXT, RequestContext, SamplingParams, TokenChunk
from harness_gym.engines.oracle import OracleEngine
from harness_gym.engines.scripted import task_key
from harness_gym.training.evaluation import (
    EPISODE_FIELDS,
    instance_pass_rates,
    instance_quit_rates,
    paired_difference,
    recorded_episodes,
    run_tasks,
    summarize,
)

needs_pi = pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")
HOLD_S = 45.0  # how long the held episode waits for another to start before giving up


class RecordsStarts(OracleEngine):
    """The oracle, noting the task of each episode as it starts."""

    def __init__(self, scorer: Any) -> None:
        super().__init__(scorer)
        self.started: list[str] = []

    def on_episode_start(self, task: Any) -> None:
        super().on_episode_start(task)
        self.started.append(task.instance_id)


class HoldsOneTask(RecordsStarts):
    """The oracle, except that the calls of the episode on `held` are answered only once
    `hold()` returns. The hold awaits on the proxy's event loop without blocking it, so other
    episodes' calls are answered meanwhile."""

    def __init__(self, scorer: Any, held: Any) -> None:
        super().__init__(scorer)
        self.held_key = task_key(held.problem_statement)

    def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams,
               context: RequestContext = NO_CONTEXT) -> AsyncIterator[TokenChunk]:
        answer = super().stream(prompt_ids, sampling, context)
        if self.held_key not in self.tokenizer.decode(prompt_ids, skip_special_tokens=False):
            return answer
        return self._after_the_hold(answer)

    async def _after_the_hold(self, answer: AsyncIterator[TokenChunk]
                              ) -> AsyncIterator[TokenChunk]:
        await self.hold()
        async for chunk in answer:
            yield chunk

    async def hold(self) -> None:
        raise NotImplementedError


class HoldsUntilAnotherStarts(HoldsOneTask):
    """The held episode gets no answer until an episode on `awaited` has started (or
    `HOLD_S` passed: then `gave_up`), as a looping episode would keep its sub-env busy."""

    def __init__(self, scorer: Any, held: Any, awaited: Any) -> None:
        super().__init__(scorer, held)
        self.awaited_id = awaited.instance_id
        self.gave_up = False
        self._awaited_started = threading.Event()

    def on_episode_start(self, task: Any) -> None:
        super().on_episode_start(task)
        if task.instance_id == self.awaited_id:
            self._awaited_started.set()

    async def hold(self) -> None:
        if not await asyncio.to_thread(self._awaited_started.wait, HOLD_S):
            self.gave_up = True


@needs_pi
def test_a_held_episode_does_not_keep_the_next_task_from_starting(tiny, tmp_path):
    # Two sub-envs, three tasks; the first task's episode is answered only once the third
    # task's episode has started. In lockstep the third waits for the first: it gives up.
    tasks = load_tasks("builtin")[:3]
    engine = HoldsUntilAnotherStarts(tiny, held=tasks[0], awaited=tasks[2])
    config = EpisodeConfig.build(engine=engine, harness="pi", progress=False)
    episodes = run_tasks(tasks, config, out_dir=tmp_path, num_envs=2, progress=False)
    assert not engine.gave_up, (
        f"the third task's episode did not start within {HOLD_S:g} s while the first was "
        f"held: the free sub-env sat idle")
    a, b, c = (t.instance_id for t in tasks)
    assert set(engine.started[:2]) == {a, b} and engine.started[2:] == [c]
    assert [e["task_id"] for e in episodes] == [a, b, c]
    assert [e["outcome"] for e in episodes] == ["passed"] * 3
    assert all(set(e) == set(EPISODE_FIELDS) and e["changed_repo"] for e in episodes)

    (file,) = tmp_path.glob("*.jsonl")
    rows = [json.loads(line) for line in file.read_text().splitlines()]
    # One row per episode, written as each finished: the second task's first, and the third
    # ran in the sub-env the second freed while the first still held its own.
    assert rows[0]["task_id"] == b and [r["step"] for r in rows] == [0, 1, 2]
    assert {r["task_id"]: r["env_index"] for r in rows} == {a: 0, b: 1, c: 1}
    assert all(r["trace"] and r["outcome"] == "passed" for r in rows)
    by_task = itemgetter("task_id")
    assert sorted(recorded_episodes(tmp_path), key=by_task) == sorted(episodes, key=by_task)

    again = run_tasks(tasks, config, out_dir=tmp_path, num_envs=2, progress=False, resume=True)
    assert again == episodes and len(engine.started) == 3
    assert list(tmp_path.glob("*.jsonl")) == [file]  # nothing ran: no env, no new file


class NeverAnswersOneTask(HoldsOneTask):
    """The held episode gets no answer for `HELD_S` (`on_hold` is called as the hold begins):
    a stop must not wait for it. The hold is a cancellable sleep, ended with the call when the
    episode's CLI is killed (`hold_cut`)."""

    def __init__(self, scorer: Any, held: Any, on_hold: Any = None) -> None:
        super().__init__(scorer, held)
        self.on_hold = on_hold
        self.hold_cut = threading.Event()

    async def hold(self) -> None:
        if self.on_hold is not None:
            self.on_hold()
        held = False
        try:
            await asyncio.sleep(HELD_S)
            held = True
        finally:
            if not held:
                self.hold_cut.set()


HELD_S = 600.0  # what closing the generator would wait for the held episode, were it waited on


@needs_pi
def test_a_consumer_that_stops_early_ends_what_runs_starts_nothing_more_and_the_env_runs_on(
        tiny):
    tasks = load_tasks("builtin")[:4]
    engine = NeverAnswersOneTask(tiny, held=tasks[0])
    vec = gym.make_vec("HarnessSWE-v0", num_envs=2, vectorization_mode="vector_entry_point",
                       tasks=tasks, engine=engine, harness="pi", progress=False)
    try:
        episodes = vec.unwrapped.run_continuously(tasks)
        _, first = next(episodes)  # the second task's: the first is held
        assert first["task_id"] == tasks[1].instance_id and first["outcome"] == "passed"
        began = time.monotonic()
        episodes.close()  # the held episode and the third task's are stopped, not waited for
        closed_s = time.monotonic() - began
        assert closed_s < 60, f"closing took {closed_s:.0f} s: the held episode was waited on"
        assert engine.hold_cut.wait(10)  # its call ended with its CLI: not left to run on
        assert set(engine.started[:2]) == {tasks[0].instance_id, tasks[1].instance_id}
        assert tasks[3].instance_id not in engine.started
        # The stop ended what ran then, nothing later: the env runs the next task to its end.
        (reward, last), = vec.unwrapped.run_continuously(tasks[3:])
        assert last["outcome"] == "passed" and reward > 0 and last["env_index"] == 0
    finally:
        vec.close()


class Interrupted(Exception):
    """What the test's SIGUSR1 handler raises in the main thread, as Ctrl-C raises
    KeyboardInterrupt (which, raised at the wrong moment, would end the whole pytest run)."""


@needs_pi
def test_an_interrupted_step_stops_its_episodes_and_the_env_runs_on(tiny):
    tasks = load_tasks("builtin")[:4]
    main = threading.main_thread().ident
    engine = NeverAnswersOneTask(tiny, held=tasks[0],
                                 on_hold=lambda: signal.pthread_kill(main, signal.SIGUSR1))
    vec = gym.make_vec("HarnessSWE-v0", num_envs=2, vectorization_mode="vector_entry_point",
                       tasks=tasks, engine=engine, harness="pi", progress=False)

    def interrupt(*_: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        vec.reset(options={"task_ids": [t.instance_id for t in tasks[:2]]})
        began = time.monotonic()
        with pytest.raises(Interrupted):  # raised once the held episode's call waits
            vec.step(None)
        stopped_s = time.monotonic() - began
        assert stopped_s < 60, f"the interrupted step took {stopped_s:.0f} s to return"
        assert engine.hold_cut.wait(10)  # stopped, not left to run on
        signal.signal(signal.SIGUSR1, previous)
        # The episodes it started are gone and the stop is over: the next step runs in full.
        vec.reset(options={"task_ids": [t.instance_id for t in tasks[2:]]})
        _, rewards, _, _, infos = vec.step(None)
        assert list(infos["outcome"]) == ["passed", "passed"] and all(rewards > 0)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        vec.close()


def _episodes(rates: dict[str, float], samples: int, *, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"task_id": task, "outcome": "passed" if rng.random() < rate else "failed",
             "n_tool_calls": 3, "patch": "diff"} for task, rate in rates.items()
            for _ in range(samples)]


def test_pass_at_1_over_samples_is_the_mean_of_the_instances_pass_rates():
    a_passed, a_failed, b_failed = ({"task_id": t, "outcome": o}
                                    for t, o in (("a", "passed"), ("a", "failed"), ("b", "failed")))
    episodes = [a_passed] * 3 + [a_failed] + [b_failed] * 4
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


def test_a_paired_quit_rate_difference_compares_each_instances_quitting():
    def quitting(rates: dict[str, float], seed: int) -> list[dict]:
        rng = random.Random(seed)
        return [{"task_id": t, "outcome": "failed", "changed_repo": rng.random() >= r}
                for t, r in rates.items() for _ in range(4)]

    rng = random.Random(4)
    gated = {f"t{i}": rng.choice([0.0, 0.25, 0.5]) for i in range(50)}
    flat = {t: min(1.0, r + 0.4) for t, r in gated.items()}
    before, after = quitting(gated, 5), quitting(flat, 6)
    diff = paired_difference(before, after, rates=instance_quit_rates)
    assert diff["n_instances"] == 50 and 25 < diff["points"] < 55 and diff["ci"][0] > 0
    assert instance_quit_rates(before + [{"task_id": "x", "outcome": "infra_error",
                                          "changed_repo": False}]) == instance_quit_rates(before)
    same = paired_difference(before, before, rates=instance_quit_rates)
    assert same["points"] == 0 and same["ci"] == [0.0, 0.0]


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
