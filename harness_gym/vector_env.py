"""`HarnessVectorEnv`: N harness episodes per `step()`, run concurrently, grouped for GRPO.

    >>> import gymnasium as gym, harness_gym
    >>> envs = gym.make_vec("HarnessSWE-v0", num_envs=4, vectorization_mode="vector_entry_point",
    ...                     harness="pi", engine="oracle", group_size=2, progress=False)
    >>> envs.num_envs, envs.unwrapped.config.engine      # nothing heavy has started yet
    (4, 'oracle')

Then each step is four Pi episodes (~40 s on two cores; tests/test_vector_env.py runs it)::

    problems, infos = envs.reset(seed=0)      # problems[0] == problems[1], [2] == [3]
    problems, rewards, terminated, truncated, infos = envs.step(
        {"policy_version": np.full(4, 7)})
    infos["outcome"], infos["policy_version_max"]
    # (array(['passed', 'passed', 'passed', 'passed'], dtype=object), array([7, 7, 7, 7]))
    envs.close()

    >>> envs.close()

Why threads and not `AsyncVectorEnv` processes: an episode is a CLI subprocess talking HTTP to
the proxy, so a step spends its time waiting; threads share ONE proxy and ONE engine, and an
engine batches concurrent streams (one token each per round) only if they reach the same engine
object. N processes would load N models and start N proxies.

Autoreset is same-step (`AutoresetMode.SAME_STEP`): every step ends every episode, so `step()`
returns the observations of the NEXT tasks, already reset, and `infos` holds the finished
episodes' infos themselves (not nested under `final_info`), plus `final_obs` (the finished
episodes' problem statements) and `next_task_id`. Infos are batched the Gymnasium way: each key
an array over sub-envs with a `_key` boolean mask; numbers become numeric arrays, schema-stable
dicts (`reward_breakdown`) are batched key by key, and per-episode structures (`trace`, `tests`,
`grade`, `harness_output`) stay whole in object arrays.

Groups: with `group_size=G`, sub-envs `[k*G, (k+1)*G)` get the same task at every reset (one
GRPO group); the seeded RNG draws one task per group. `harness` may be a list: by default each
group runs ONE harness (group k the k-th, cycled), so a group's episodes share their prompt and
its baseline compares like with like; `mix_harnesses=True` alternates the list inside every
group instead. Each distinct harness gets its own `EpisodeRunner` on the shared proxy, and
`infos["harness"]` says which ran.

Settings: every keyword of `make` but `num_envs`, `tasks`, `install_config` (rows without one, as
for `HarnessSWE-v0`), `group_size` and the executor's is an
episode setting, validated into one `EpisodeConfig` (see `harness_gym.config`); `config=` passes
a ready one (keywords given beside it override its fields).

The step's episodes go to an `EpisodeExecutor` (`harness_gym.scaleout.executors`): local
threads, or with `executor="ray"` / `executor=RayCluster(...)` a Ray cluster: one `NodeRunner`
actor per suitable node, each with its own proxy in front of the engine, which must then be a
spec string (`vllm:URL` on a real cluster). `RayCluster` holds every Ray setting (address,
`ray.init` keywords, actor options, node labels, the executor's clocks). Infos are the same
either way. See `harness_gym.scaleout.ray_executor` and docs/scale-out.md.

A task list to get through (an evaluation) wants no lockstep: a step waits for its slowest
episode, and one looping episode (880 s where the others took 40-130 s) idles every other
sub-env. `run_continuously(tasks)` keeps all `num_envs` busy instead, starting the next task the
moment an episode ends, and yields each episode's `(reward, info)` as it finishes.

An interrupted `step()` (a notebook's Ctrl-C, a SIGTERM turned into an exception) or a closed
`run_continuously` generator stops the episodes it started (the executor's `stop_running`:
each CLI killed within about a second), whose results would be dropped, and the env runs on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from typing import Any, ClassVar, Self

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .config import EpisodeConfig, EpisodeConfigError
from .engines import Engine
from .env import ACTION_SPACE, MAX_PROBLEM_CHARS, AnyText, parse_action
from .episode import EpisodeRequest, EpisodeResult
from .scaleout.executors import (EpisodeExecutor, ExecutorSpec, executor_factory,
                                 reject_ray_keywords, start_executor)
from .harness import HarnessSpec
from .tasks.loader import TaskSpec, load_tasks
from .tasks.task import Task

# Per-episode structures whose keys differ between episodes: batching them key by key would
# give a sparse dict of test names across tasks, so they stay whole, one dict/list per sub-env.
WHOLE_INFO_KEYS = frozenset({"trace", "tests", "grade", "harness_output"})


class HarnessVectorEnv(VectorEnv):
    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP,
                                          "render_modes": []}

    def __init__(
        self,
        num_envs: int = 1,
        tasks: TaskSpec | list[Task] = "builtin",
        install_config: Mapping[str, Any] | None = None,
        group_size: int = 1,
        executor: ExecutorSpec = "threads",
        config: EpisodeConfig | None = None,
        **settings: Any,
    ) -> None:
        if num_envs < 1 or group_size < 1 or num_envs % group_size:
            raise ValueError(f"num_envs={num_envs} must be a positive multiple of "
                             f"group_size={group_size}")
        reject_ray_keywords(settings)
        self._executor_factory = executor_factory(executor)
        self.config = EpisodeConfig.build(config, **settings)
        n_groups, n_harnesses = num_envs // group_size, len(self.config.harness)
        if n_groups < n_harnesses and not self.config.mix_harnesses:
            raise EpisodeConfigError(
                f"{n_harnesses} harnesses need at least {n_harnesses} groups (one harness per "
                f"group), got {n_groups}: raise num_envs to {n_harnesses * group_size}, or "
                f"pass mix_harnesses=True to alternate them inside each group")
        self.harnesses: list[HarnessSpec] = [
            spec for k in range(n_groups) for spec in self.config.group_harnesses(k, group_size)]
        self.tasks = load_tasks(tasks, install_config=install_config)
        self.num_envs = num_envs
        self.group_size = group_size
        self.single_observation_space = AnyText(MAX_PROBLEM_CHARS)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.single_action_space = ACTION_SPACE
        self.action_space = batch_space(ACTION_SPACE, num_envs)
        self.policy_version: int | None = None  # used where an action gives none
        self._current: list[Task] | None = None
        self._executor: EpisodeExecutor | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def _start(self) -> EpisodeExecutor:
        if self._executor is None:
            self._executor = start_executor(self._executor_factory, self.config,
                                            max_workers=self.num_envs)
        return self._executor

    @property
    def executor(self) -> EpisodeExecutor | None:
        """Where the episodes run, once the first `reset()` started it (None before)."""
        return self._executor

    @property
    def engine(self) -> Engine:
        return self._start().engine

    def close_extras(self, **kwargs: Any) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.close()

    # --- gymnasium API --------------------------------------------------------------------

    def set_policy_version(self, version: int | None) -> None:
        """The weights' version recorded on every call where an action names none."""
        self.policy_version = None if version is None else int(version)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Draw one task per group. `options={"task_ids": [...]}` names one per group."""
        super().reset(seed=seed)
        self._start()
        task_ids = (options or {}).get("task_ids")
        self._current = self._draw_tasks(task_ids)
        return self._observations(), self._reset_infos()

    def step(
        self, actions: dict[str, Any] | Sequence[dict[str, Any] | None] | None
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._current is None:
            raise gym.error.ResetNeeded("call reset() before step(): each step is one episode")
        per_env = self._split_actions(actions)
        tasks, self._current = self._current, None
        executor = self._start()
        futures = {
            executor.submit(EpisodeRequest(self.harnesses[i].name, tasks[i], sampling, version)): i
            for i, (sampling, version) in enumerate(per_env)
        }
        results: list[EpisodeResult | None] = [None] * self.num_envs
        try:
            with _StepProgress(self.num_envs, enabled=self.config.progress) as bar:
                for future in as_completed(futures):
                    result = future.result()  # EpisodeRunner.run makes every failure an outcome
                    results[futures[future]] = result
                    bar.done(result.outcome)
        except BaseException:  # an interrupt: nobody will see these episodes' results
            _stop_and_wait(executor, futures)
            raise
        episodes = [r.info() for r in results]
        self._current = self._draw_tasks(None)  # same-step autoreset
        for i, info in enumerate(episodes):
            info["final_obs"] = tasks[i].problem_statement
            info["next_task_id"] = self._current[i].instance_id
        rewards = np.array([r.reward for r in results], dtype=np.float64)
        terminations = np.ones(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        return self._observations(), rewards, terminations, truncations, batch_infos(episodes)

    def run_continuously(
        self, tasks: Iterable[Task], action: dict[str, Any] | None = None
    ) -> Iterator[tuple[float, dict[str, Any]]]:
        """Run each task once, `num_envs` episodes in flight until the tasks run out, and yield
        `(reward, info)` per episode in the order they finish; `info` is a step's info for that
        episode plus `env_index`, the sub-env whose slot (and harness) it ran in.

        Outside the step cycle: no `reset()` needed, groups do not apply (each task is one
        episode), and the env's current tasks are left as they were. One `action` (or None)
        gives every episode its sampling and version, as in `step()`.

        The next task is submitted only when a slot frees: a queued episode would hold a Ray
        node's slot, and would still run after the consumer gave up (a Ray future's `cancel()`
        does not reach the node). When the generator is closed early or fails (a consumer's
        `break`, a notebook's interrupt), the episodes it submitted are stopped, their results
        dropped (`_stop_and_wait`); no further task starts, and the env runs on.
        """
        sampling, version = self._parse_action(action)
        executor = self._start()
        todo = iter(tasks)
        running: dict[Future[EpisodeResult], int] = {}

        def fill(slot: int) -> None:
            task = next(todo, None)
            if task is not None:
                request = EpisodeRequest(self.harnesses[slot].name, task, sampling, version)
                running[executor.submit(request)] = slot

        try:
            for slot in range(self.num_envs):
                fill(slot)
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    slot = running.pop(future)
                    result = future.result()
                    fill(slot)  # before yielding: the consumer's time must not idle the slot
                    yield result.reward, {**result.info(), "env_index": slot}
        finally:
            _stop_and_wait(executor, running)

    # --- helpers --------------------------------------------------------------------------

    def _draw_tasks(self, task_ids: Sequence[str] | None) -> list[Task]:
        n_groups = self.num_envs // self.group_size
        if task_ids is not None:
            if len(task_ids) != n_groups:
                raise ValueError(f"task_ids names one task per group: {n_groups}, "
                                 f"got {len(task_ids)}")
            by_id = {t.instance_id: t for t in self.tasks}
            missing = [t for t in task_ids if t not in by_id]
            if missing:
                raise ValueError(f"no task {missing[0]!r} in this suite; known: "
                                 f"{', '.join(by_id)}")
            chosen = [by_id[t] for t in task_ids]
        else:
            picks = self.np_random.integers(len(self.tasks), size=n_groups)
            chosen = [self.tasks[int(k)] for k in picks]
        return [task for task in chosen for _ in range(self.group_size)]

    def _observations(self) -> tuple[str, ...]:
        return tuple(task.problem_statement for task in self._current)

    def _reset_infos(self) -> dict[str, Any]:
        return batch_infos([
            {"task_id": t.instance_id, "repo": t.repo, "harness": h.name,
             "group": i // self.group_size}
            for i, (t, h) in enumerate(zip(self._current, self.harnesses))
        ])

    def _split_actions(self, actions: Any) -> list[tuple[dict[str, Any], int | None]]:
        """Per sub-env (sampling, version): actions are None, a batched Dict (a dict of arrays,
        as `action_space.sample()` gives) or a sequence of per-env dicts."""
        if actions is None:
            per_env: list[dict[str, Any] | None] = [None] * self.num_envs
        elif isinstance(actions, dict):
            per_env = [{k: np.asarray(v)[i] for k, v in actions.items() if v is not None}
                       for i in range(self.num_envs)]
        elif isinstance(actions, Sequence) and len(actions) == self.num_envs:
            per_env = list(actions)
        else:
            raise TypeError(f"actions are None, a dict of arrays of length {self.num_envs}, or "
                            f"a sequence of {self.num_envs} per-env dicts; got {actions!r:.200}")
        return [self._parse_action(action) for action in per_env]

    def _parse_action(self, action: dict[str, Any] | None) -> tuple[dict[str, Any], int | None]:
        sampling, version = parse_action(action, self.config.sampling)
        return sampling, self.policy_version if version is None else version


def _stop_and_wait(executor: EpisodeExecutor, futures: Iterable[Future[EpisodeResult]]) -> None:
    """Cancel the episodes that have not started; stop the running ones (`stop_running`, where
    the executor has it: every episode it runs then ends within about a second, its CLI
    killed), since nobody will read their results; wait until all have ended."""
    pending = [f for f in futures if not f.cancel() and not f.done()]
    stop_running = getattr(executor, "stop_running", None)
    if pending and stop_running is not None:
        stop_running()
    wait(pending)


def batch_infos(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-env info dicts -> one dict of arrays with `_key` masks (Gymnasium's layout).

    Unlike `VectorEnv._add_info`, the dtype is chosen from all envs' values at once, so an info
    that is an int in one env and None in another (`policy_version_min` of an episode that made
    no call) becomes an object array instead of failing on the assignment.
    """
    n = len(infos)
    batched: dict[str, Any] = {}
    keys = dict.fromkeys(k for info in infos for k in info)
    for key in keys:
        mask = np.array([key in info for info in infos], dtype=np.bool_)
        values = [info.get(key) for info in infos]
        present = [v for v, m in zip(values, mask) if m]
        if key not in WHOLE_INFO_KEYS and all(isinstance(v, dict) for v in present):
            batched[key] = batch_infos([v if isinstance(v, dict) else {} for v in values])
        else:
            batched[key] = _array(values, mask, n)
        batched[f"_{key}"] = mask
    return batched


def _array(values: list[Any], mask: np.ndarray, n: int) -> np.ndarray:
    present = [v for v, m in zip(values, mask) if m]
    kinds = {type(v) for v in present}
    kind = next(iter(kinds), None)
    if len(kinds) == 1 and (kinds <= {bool, int, float} or issubclass(kind, np.number)):
        array = np.zeros(n, dtype=kind)
        array[mask] = present
        return array
    array = np.full(n, None, dtype=object)
    for i, (v, m) in enumerate(zip(values, mask)):
        if m:
            array[i] = v
    return array


class _StepProgress:
    """A tqdm bar for one step: one tick per finished episode, outcomes so far as postfix."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._bar = None
        self._outcomes: Counter[str] = Counter()
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc="episodes", unit="ep", leave=False)

    def done(self, outcome: str) -> None:
        self._outcomes[outcome] += 1
        if self._bar is not None:
            self._bar.set_postfix(self._outcomes, refresh=False)
            self._bar.update(1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
