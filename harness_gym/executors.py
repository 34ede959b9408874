"""Where a vector step's episodes run: the `EpisodeExecutor` protocol and its local threads.

`HarnessVectorEnv` hands every episode of a step to an executor and gathers the futures; it does
not know where they run. `ThreadEpisodeExecutor` runs them on threads in this process around one
`EpisodeStack` (one engine, one proxy); `harness_gym.ray_executor.RayEpisodeExecutor` runs them
on Ray actors, one stack per node. Both are built from the same `EpisodeConfig`.

Which one an env uses is an `ExecutorFactory`, named by the env's `executor=` argument:
`"threads"` (`LocalThreads()`), `"ray"` (`harness_gym.ray_cluster.RayCluster()`), or a factory
object itself (`RayCluster(address=..., actor_options=..., node_labels=...)`, or anything with
a `start(config, *, max_workers)` method). Code that builds envs on a user's behalf (the TRL
integration, a trainer) takes the same value and passes it through.

    >>> from harness_gym.ray_cluster import RayCluster
    >>> executor_factory("threads")
    LocalThreads()
    >>> executor_factory("ray", ray_address="auto").address
    'auto'
    >>> executor_factory(RayCluster(address="auto")) == RayCluster(address="auto")
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from .config import EpisodeConfig
from .engines import Engine
from .episode import EpisodeRequest, EpisodeResult, EpisodeStack

ExecutorName = Literal["threads", "ray"]


class EpisodeExecutor(Protocol):
    """Runs episodes somewhere and answers futures of their results.

    A future always resolves to an `EpisodeResult`: an episode that could not run (a lost
    node, an unknown harness) is an `infra_error` result, never an exception.
    """

    @property
    def engine(self) -> Engine:
        """The engine object, where it lives in this process (else AttributeError)."""
        ...

    def submit(self, request: EpisodeRequest) -> Future[EpisodeResult]: ...

    def close(self) -> None:
        """Wait for running episodes, then release everything the executor started."""
        ...


class ThreadEpisodeExecutor:
    """Episodes on `max_workers` threads sharing one `EpisodeStack`: one proxy and one engine,
    which batches the concurrent streams (see `harness_gym.vector_env`)."""

    def __init__(self, config: EpisodeConfig, *, max_workers: int) -> None:
        self.stack = EpisodeStack(config)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="harness-episode")

    @property
    def engine(self) -> Engine:
        return self.stack.engine

    def submit(self, request: EpisodeRequest) -> Future[EpisodeResult]:
        return self._pool.submit(self.stack.run, request)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.stack.close()


@runtime_checkable
class ExecutorFactory(Protocol):
    """Starts the executor of one env (at its first `reset()`); `max_workers` is its number of
    sub-envs, the most episodes it runs at once."""

    def start(self, config: EpisodeConfig, *, max_workers: int) -> EpisodeExecutor: ...


@dataclass(frozen=True)
class LocalThreads:
    """`executor="threads"`: episodes on threads of this process (`ThreadEpisodeExecutor`)."""

    def start(self, config: EpisodeConfig, *, max_workers: int) -> ThreadEpisodeExecutor:
        return ThreadEpisodeExecutor(config, max_workers=max_workers)


ExecutorSpec = ExecutorName | ExecutorFactory


def executor_factory(
    executor: ExecutorSpec,
    *,
    ray_address: str | None = None,
    ray_init: Mapping[str, Any] | None = None,
    ray_actor_options: Mapping[str, Any] | None = None,
) -> ExecutorFactory:
    """The factory an env's `executor=` names. The `ray_*` shorthands fill a `RayCluster` for
    `executor="ray"`; with a factory object, set them on the object instead."""
    shorthands = {"ray_address": ray_address, "ray_init": ray_init,
                  "ray_actor_options": ray_actor_options}
    given = sorted(k for k, v in shorthands.items() if v is not None)
    if executor == "ray":
        from .ray_cluster import RayCluster

        return RayCluster(address=ray_address, init_kwargs=dict(ray_init or {}),
                          actor_options=dict(ray_actor_options or {}))
    if given:
        raise ValueError(
            f"{', '.join(given)} apply to executor='ray' only; with a RayCluster, set them on it "
            "(RayCluster(address=..., init_kwargs=..., actor_options=...))")
    if executor == "threads":
        return LocalThreads()
    if isinstance(executor, ExecutorFactory) and not isinstance(executor, str):
        return executor
    raise ValueError(f"executor is 'threads', 'ray' or an ExecutorFactory such as "
                     f"harness_gym.ray_cluster.RayCluster(...), got {executor!r}")


def make_executor(
    executor: ExecutorSpec,
    config: EpisodeConfig,
    *,
    max_workers: int,
    ray_address: str | None = None,
    ray_init: Mapping[str, Any] | None = None,
    ray_actor_options: Mapping[str, Any] | None = None,
) -> EpisodeExecutor:
    """A started executor, for code that runs episodes without a vector env (an async rollout
    worker): `executor` and the `ray_*` shorthands as `executor_factory` takes them."""
    factory = executor_factory(executor, ray_address=ray_address, ray_init=ray_init,
                               ray_actor_options=ray_actor_options)
    return factory.start(config, max_workers=max_workers)
