"""`EpisodeConfig`: every setting of an episode, validated once and passed down whole.

`gymnasium.make("HarnessSWE-v0", **kwargs)`, `make_vec`, the Ray executor's node runners and the
TRL integration all take the same settings; this is the one place they are declared, defaulted
and checked. Everything below the env (`EpisodeStack`, `EpisodeRunner`, the executors) receives
the config object, never the loose list.

    >>> from harness_gym.config import EpisodeConfig
    >>> config = EpisodeConfig(harness="pi", engine="oracle", episode_timeout_s=60)
    >>> config.harness[0].name, config.engine, config.sandbox, config.reward.success
    ('pi', 'oracle', None, 1.0)
    >>> EpisodeConfig(engine="smollm")
    Traceback (most recent call last):
    ...
    harness_gym.config.EpisodeConfigError: unknown engine 'smollm' (did you mean 'smollm2'?); ...

Names (harness, engine, sandbox) are checked against their entry points here, at `make()` time,
without loading anything heavy: an engine's model loads at the env's first `reset()`. So is each
harness's minimum context window (`HarnessSpec.min_context`) against the engine's, where the
window is known without loading (`harness_gym.engines.context`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .engines import ENTRY_POINT_GROUP as ENGINES
from .engines import Engine
from .engines.context import declared_context
from .harness import ContextTooSmall, HarnessSpec, load_harness
from .plugins import check_plugin_name, did_you_mean
from .proxy.errors import ProxyError
from .proxy.sessions import check_context_overflow, parse_session_sampling
from .rewards import RewardConfig
from .sandbox import ENTRY_POINT_GROUP as SANDBOXES
from .sandbox import SandboxBackend, SandboxError
from .sandbox.base import SandboxLimits

ContextOverflow = Literal["error", "truncate"]


class EpisodeConfigError(ValueError):
    """A setting of `make` is not valid (unknown name, wrong value): fix the call."""


@dataclass(frozen=True, init=False)
class EpisodeConfig:
    """The settings of every episode an env runs (see the module docstring).

    - `harness`: the harness plugins, one or several (a vector env cycles them over its
      sub-envs); given as names or `HarnessSpec` objects.
    - `engine`: an engine spec string (`tiny`, `smollm2`, `oracle`, `vllm:URL`, ...) or an
      `Engine` object (then the caller's: the env does not close it). The default, `auto`, is
      SmolLM2: in process for one episode at a time, a real vLLM server the env starts where
      several run at once and vLLM is installed (`harness_gym.engines.auto`).
    - `sandbox`: a backend name or object; None picks `harness_gym.sandbox.default_sandbox()`
      on the machine where the episodes run.
    - `reward`: a `RewardConfig` or a dict of its fields.
    - `episode_timeout_s` bounds the CLI's run, `test_timeout_s` the test command.
    - `max_model_calls`: once the policy has answered this many calls of an episode, the proxy
      refuses the next one and the CLI is stopped; the tree is graded as the agent left it, and
      `info["call_limit_reached"]` says so (None: no limit; a looping policy then runs until
      `episode_timeout_s`).
    - `sampling`: the session's sampling overrides (`temperature`, `top_p`, `top_k`,
      `max_tokens`, `seed`).
    - `context_overflow`: "error" (the CLI gets its dialect's context-too-long error and
      compacts) or "truncate" (the proxy blanks the oldest tool results).
    - `mix_harnesses`: with several harnesses, False (the default) gives each GRPO group one
      harness, groups cycling through the list, so a group's baseline compares one prompt's
      episodes; True alternates the harnesses inside every group (its members then answer
      different prompts: each CLI has its own system prompt and tools).
    - `train_subagents`: a sub-agent's segments (Claude Code's Task tool), linked to the tool
      call that started them, are role "agent" (trained on) instead of "auxiliary".
    - `progress`: install messages and progress bars on stderr.
    - `limits`: what one rollout's sandbox may use, a `SandboxLimits` or a dict of its fields
      (`pids`, `memory_bytes`, `disk_bytes`); None keeps the backend's defaults (`bwrap` and
      `local`: 1,024 processes and threads, 4 GiB of memory, 4 GiB on disk; `docker`: 2,048,
      "4g", a "2g" /sandbox). An env refuses to start where a cap cannot be had here
      (`harness_gym.sandbox.caps`), and says how to get it, unless `allow_uncapped=True`
      (one loud warning line; not for training).
    """

    harness: tuple[HarnessSpec, ...]
    engine: str | Engine
    sandbox: str | SandboxBackend | None
    reward: RewardConfig
    episode_timeout_s: float
    test_timeout_s: float
    max_model_calls: int | None
    sampling: Mapping[str, Any]
    context_overflow: ContextOverflow
    mix_harnesses: bool
    train_subagents: bool
    progress: bool
    limits: SandboxLimits | None
    allow_uncapped: bool

    def __init__(
        self,
        *,
        harness: str | HarnessSpec | Sequence[str | HarnessSpec] = "pi",
        engine: str | Engine = "auto",
        sandbox: str | SandboxBackend | None = None,
        reward: RewardConfig | Mapping[str, Any] | None = None,
        episode_timeout_s: float = 900.0,
        test_timeout_s: float = 300.0,
        max_model_calls: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        context_overflow: ContextOverflow = "error",
        mix_harnesses: bool = False,
        train_subagents: bool = False,
        progress: bool = True,
        limits: SandboxLimits | Mapping[str, int] | None = None,
        allow_uncapped: bool = False,
    ) -> None:
        if episode_timeout_s <= 0 or test_timeout_s <= 0:
            raise EpisodeConfigError("episode_timeout_s and test_timeout_s must be positive")
        if max_model_calls is not None and (isinstance(max_model_calls, bool)
                                            or not isinstance(max_model_calls, int)
                                            or max_model_calls < 1):
            raise EpisodeConfigError(
                f"max_model_calls must be a whole number of calls, at least 1 (or None for no "
                f"limit), got {max_model_calls!r}")
        names = [harness] if isinstance(harness, (str, HarnessSpec)) else list(harness)
        if not names:
            raise EpisodeConfigError("harness must name at least one harness")
        try:
            checked_sampling = parse_session_sampling(dict(sampling or {}))
            check_context_overflow(context_overflow)
        except ProxyError as exc:
            raise EpisodeConfigError(str(exc)) from None
        values = {
            "harness": tuple(load_harness(h) for h in names),
            "engine": _check_engine(engine),
            "sandbox": _check_sandbox(sandbox),
            "reward": RewardConfig.coerce(dict(reward) if isinstance(reward, Mapping) else reward),
            "episode_timeout_s": float(episode_timeout_s),
            "test_timeout_s": float(test_timeout_s),
            "max_model_calls": max_model_calls,
            "sampling": checked_sampling,
            "context_overflow": context_overflow,
            "mix_harnesses": bool(mix_harnesses),
            "train_subagents": bool(train_subagents),
            "progress": bool(progress),
            "limits": _check_limits(limits),
            "allow_uncapped": bool(allow_uncapped),
        }
        _check_context(values["harness"], values["engine"])
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def build(cls, config: EpisodeConfig | None = None, **settings: Any) -> EpisodeConfig:
        """A config from `make`'s keyword arguments, over `config` when one is given. Unknown
        keywords are an error that names the nearest setting."""
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            name = sorted(unknown)[0]
            raise EpisodeConfigError(
                f"unknown setting {name!r}{did_you_mean(name, list(SETTINGS))}; "
                f"settings: {', '.join(SETTINGS)}"
            )
        if config is None:
            return cls(**settings)
        return dataclasses.replace(config, **settings) if settings else config

    def group_harnesses(self, group: int, size: int) -> list[HarnessSpec]:
        """The harness of each of the `size` members of GRPO group number `group`."""
        specs = self.harness
        if self.mix_harnesses:
            return [specs[i % len(specs)] for i in range(size)]
        return [specs[group % len(specs)]] * size

    def replace(self, **settings: Any) -> EpisodeConfig:
        """A copy with some settings changed (validated again)."""
        return EpisodeConfig.build(self, **settings)


#: The settings `EpisodeConfig` takes, in order (`make`'s episode keywords).
SETTINGS: tuple[str, ...] = tuple(
    p for p in inspect.signature(EpisodeConfig.__init__).parameters if p != "self"
)


def _check_engine(engine: str | Engine) -> str | Engine:
    if isinstance(engine, Engine):
        return engine
    if not isinstance(engine, str) or not engine.strip():
        raise EpisodeConfigError(
            f"an engine is a spec string (e.g. 'tiny', 'vllm:http://host:8000') or an Engine, "
            f"got {engine!r}"
        )
    name = engine.strip().partition(":")[0]
    check_plugin_name(ENGINES, name, noun="engine", error=EpisodeConfigError)
    return engine.strip()


def _check_limits(limits: SandboxLimits | Mapping[str, int] | None) -> SandboxLimits | None:
    if limits is None or isinstance(limits, SandboxLimits):
        return limits
    if not isinstance(limits, Mapping):
        raise EpisodeConfigError(f"limits is a SandboxLimits or a dict of its fields, got {limits!r}")
    fields = {f.name for f in dataclasses.fields(SandboxLimits)}
    if unknown := sorted(set(limits) - fields):
        raise EpisodeConfigError(
            f"unknown limit {unknown[0]!r}{did_you_mean(unknown[0], sorted(fields))}; "
            f"limits: {', '.join(sorted(fields))}"
        )
    try:
        return SandboxLimits(**limits)
    except SandboxError as exc:
        raise EpisodeConfigError(str(exc)) from None


def _check_sandbox(sandbox: str | SandboxBackend | None) -> str | SandboxBackend | None:
    if sandbox is None or isinstance(sandbox, SandboxBackend):
        return sandbox
    if not isinstance(sandbox, str):
        raise SandboxError(f"a sandbox is a backend name or a SandboxBackend, got {sandbox!r}")
    check_plugin_name(SANDBOXES, sandbox, noun="sandbox backend", error=SandboxError)
    return sandbox


def _check_context(harnesses: tuple[HarnessSpec, ...], engine: str | Engine) -> None:
    """Each harness's `min_context` against the engine's window, where it is known now."""
    window = declared_context(engine)
    if window is None:
        return  # known once the engine loads: each episode checks it then
    for spec in harnesses:
        try:
            spec.check_context(window)
        except ContextTooSmall as exc:
            raise EpisodeConfigError(str(exc)) from None
