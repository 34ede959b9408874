"""`HarnessSWE-v0`: one `step()` is one whole episode of a real coding-agent CLI on a task.

    import gymnasium as gym, harness_gym
    env = gym.make("HarnessSWE-v0", harness="pi", engine="oracle")
    problem, info = env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step({"policy_version": 0})
    info["outcome"], reward, len(info["trace"])     # ('passed', 0.99, 1)
    env.close()

(A code block, not a doctest: it installs and runs the Pi CLI; tests/test_env.py runs it.)
Settings are checked when the env is made, before anything heavy loads:

    >>> import gymnasium as gym, harness_gym
    >>> gym.make("HarnessSWE-v0", harness="pi", engine="smollm")
    Traceback (most recent call last):
    ...
    harness_gym.config.EpisodeConfigError: unknown engine 'smollm' (did you mean 'smollm2'?); ...

Keywords: `tasks` (a suite name, path or list of `Task`s), `install_config` (for dataset rows that
carry none, as plain SWE-bench rows: `{"test_cmd": ..., "log_parser": ...}`, see
`harness_gym.tasks.Task`), `render_mode`, and the episode
settings of `harness_gym.config.EpisodeConfig` (`harness`, `engine`, `sandbox`, `reward`,
`episode_timeout_s`, `test_timeout_s`, `max_model_calls`, `sampling`, `context_overflow`,
`progress`), or `config=`
a ready `EpisodeConfig`. `sandbox=None` picks `harness_gym.sandbox.default_sandbox()`.

Observation: the task's problem statement (a `str`; `AnyText` space). Action: a dict, every key
optional (`None` works too): `policy_version` (int, the version of the weights the engine is
serving, recorded on every call of the episode) and `temperature` (float in [0, 2], overriding
the session's sampling). Each step ends the episode: `terminated` is True, `truncated` False;
time-outs are reported as `info["outcome"] == "timeout"`.

`info` holds: `task_id`, `harness`, `outcome` (passed, failed, timeout, harness_error,
infra_error), `reward_breakdown`, `n_llm_calls`, `n_tool_calls`, `n_truncations`,
`call_limit_reached` (stopped at `max_model_calls`; graded as it stood), `tests`
(test id -> status), `patch`, `trace` (segments as plain lists, fields as
`harness_gym.trace.SEGMENT_SCHEMA`), `model` (the engine's model name), `tokenizer` (what the
trace's ids decode with: "tiny", "smollm2" or a tokenizer directory; None if the engine names
none), `policy_version_min` / `policy_version_max`, `duration_s`, `harness_output`, `grade` and
`error`; see docs/design.md.

Heavy resources (engine, proxy, harness install) are created at the first `reset()`, so
`gymnasium.make` is cheap and `close()` releases everything the env started.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .config import EpisodeConfig, EpisodeConfigError
from .engines import Engine
from .episode import EpisodeRequest, EpisodeResult, EpisodeStack
from .harness import HarnessSpec
from .proxy import InterceptionProxy
from .tasks.loader import TaskSpec, load_tasks
from .tasks.task import Task

MAX_PROBLEM_CHARS = 200_000


class AnyText(spaces.Text):
    """A `Text` space that contains every string up to `max_length` characters.

    Gymnasium's `Text` only admits characters of its charset (alphanumerics by default), and
    issue texts hold any Unicode. Sampling still draws from printable ASCII.
    """

    def __init__(self, max_length: int) -> None:
        super().__init__(max_length=max_length, min_length=0,
                         charset="".join(chr(c) for c in range(32, 127)))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


ACTION_SPACE = spaces.Dict(
    {
        "policy_version": spaces.Discrete(2**31 - 1),
        "temperature": spaces.Box(0.0, 2.0, shape=(), dtype=np.float32),
    }
)


class HarnessSWEEnv(gym.Env[str, dict]):
    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        tasks: TaskSpec | list[Task] = "builtin",
        install_config: Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        config: EpisodeConfig | None = None,
        **settings: Any,
    ) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.config = EpisodeConfig.build(config, **settings)
        if len(self.config.harness) != 1:
            raise EpisodeConfigError(
                "HarnessSWE-v0 runs one harness per env; for several use gymnasium.make_vec "
                f"(got {[h.name for h in self.config.harness]})")
        self.harness: HarnessSpec = self.config.harness[0]
        self.tasks = load_tasks(tasks, install_config=install_config)
        self.render_mode = render_mode
        self.observation_space = AnyText(MAX_PROBLEM_CHARS)
        self.action_space = ACTION_SPACE
        self._stack: EpisodeStack | None = None
        self._task: Task | None = None
        self._last: EpisodeResult | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def _start(self) -> EpisodeStack:
        if self._stack is None:
            self._stack = EpisodeStack(self.config)
        return self._stack

    @property
    def engine(self) -> Engine:
        return self._start().engine

    @property
    def proxy(self) -> InterceptionProxy:
        """The interception proxy the episodes' CLIs talk to (its settings take an observer
        of every model call, `on_progress`)."""
        proxy = self._start().proxy
        assert proxy is not None  # a started stack has its proxy
        return proxy

    def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    # --- gymnasium API --------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Pick a task: `options={"task_id": ...}` names one, else the seeded RNG draws one."""
        super().reset(seed=seed)
        self._start()
        task_id = (options or {}).get("task_id")
        if task_id is not None:
            matches = [t for t in self.tasks if t.instance_id == task_id]
            if not matches:
                known = ", ".join(t.instance_id for t in self.tasks)
                raise ValueError(f"no task {task_id!r} in this suite; known: {known}")
            self._task = matches[0]
        else:
            self._task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self._last = None
        return self._task.problem_statement, {"task_id": self._task.instance_id,
                                              "repo": self._task.repo}

    def step(self, action: dict[str, Any] | None) -> tuple[str, float, bool, bool, dict]:
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before step(): each step is one episode")
        sampling, version = parse_action(action, self.config.sampling)
        self._last = self._start().run(
            EpisodeRequest(self.harness.name, self._task, sampling, version))
        observation = self._task.problem_statement
        self._task = None  # one episode per reset
        return observation, self._last.reward, True, False, self._last.info()

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._last is None:
            return None
        r = self._last
        return (f"{r.task_id} [{r.harness}] {r.outcome} reward={r.reward:.3f} "
                f"llm_calls={r.n_llm_calls} tool_calls={r.n_tool_calls}")


def parse_action(
    action: dict[str, Any] | None, base_sampling: Mapping[str, Any]
) -> tuple[dict[str, Any], int | None]:
    """(session sampling, policy version) from an action; see the module docstring."""
    if action is None:
        return dict(base_sampling), None
    if not isinstance(action, dict):
        raise TypeError(f"an action is a dict (or None), got {type(action).__name__}")
    unknown = set(action) - set(ACTION_SPACE.spaces)
    if unknown:
        raise ValueError(f"unknown action keys {sorted(unknown)}; known: {list(ACTION_SPACE.spaces)}")
    sampling = dict(base_sampling)
    if action.get("temperature") is not None:
        sampling["temperature"] = float(np.asarray(action["temperature"]))
    version = action.get("policy_version")
    return sampling, None if version is None else int(version)
