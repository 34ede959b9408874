"""Where a vector step's episodes run: the `EpisodeExecutor` protocol and its local threads.

`HarnessVectorEnv` hands every episode of a step to an executor and gathers the futures; it does not
know where they run. `ThreadEpisodeExecutor` runs them on threads in this process around one
`EpisodeStack` (one engine, one proxy); `ray_executor.RayEpisodeExecutor` runs them on Ray actors,
one stack per node. Both are built from the same `EpisodeConfig`.

Which one an env uses is an `ExecutorFactory`, named by the env's `executor=` argument: `"threads"`
(`LocalThreads()`), `"ray"` (`RayCluster()`: a local cluster), a `RayCluster(address=...,
actor_options=..., node_labels=...)` (every Ray setting lives there), or anything with a
`start(config, *, max_workers)` method. Code that builds envs on a user's behalf (the TRL
integration, a trainer) takes the same value and passes it through.

    >>> from harness_gym import RayCluster
    >>> executor_factory("threads")
    LocalThreads()
    >>> executor_factory("ray") == RayCluster()
    True
    >>> executor_factory(RayCluster(address="auto")) == RayCluster(address="auto")
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ..config import EpisodeConfig
from ..engines import Engine
from ..episode import EpisodeRequest, EpisodeResult, EpisodeStack
from .ray_cluster import RayCluster

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
        self.stack = EpisodeStack(config, in_flight=max_workers)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="harness-episode")

    @property
    def engine(self) -> Engine:
        return self.stack.engine

    def submit(self, request: EpisodeRequest) -> Future[EpisodeResult]:
        return self._pool.submit(self.stack.run, request, stopping=self.stack.stopping)

    def stop_running(self) -> None:
        """End the running episodes now (`infra_error`); queued ones never start; episodes
        submitted later run."""
        self.stack.stop_running()

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


ExecutorSpec = ExecutorName | RayCluster | ExecutorFactory

# Ray settings have one home, `RayCluster`; these keywords once sat beside `executor=`.
_RAY_KEYWORDS = {"ray_address": "address", "ray_init": "init_kwargs",
                 "ray_actor_options": "actor_options"}


def reject_ray_keywords(settings: Mapping[str, Any]) -> None:
    """A clear error for the retired `ray_*` keywords, naming the `RayCluster` field to use."""
    given = [k for k in _RAY_KEYWORDS if k in settings]
    if given:
        fields = ", ".join(f"{_RAY_KEYWORDS[k]}=..." for k in given)
        raise TypeError(f"{', '.join(given)}: Ray settings go on the cluster record, "
                        f"executor=RayCluster({fields}) (from harness_gym import RayCluster)")


def executor_factory(executor: ExecutorSpec) -> ExecutorFactory | RayCluster:
    """The factory an env's `executor=` names: "threads", "ray" (`RayCluster()`, a local
    cluster), a `RayCluster(...)`, or any object with `start(config, *, max_workers)`."""
    if executor == "threads":
        return LocalThreads()
    if executor == "ray":
        return RayCluster()
    if isinstance(executor, (RayCluster, ExecutorFactory)) and not isinstance(executor, str):
        return executor
    raise ValueError(f"executor is 'threads', 'ray', a RayCluster(...) or an ExecutorFactory, "
                     f"got {executor!r}")


def start_executor(factory: ExecutorFactory | RayCluster, config: EpisodeConfig, *,
                   max_workers: int) -> EpisodeExecutor:
    """Starts what `executor_factory` answered; `max_workers` episodes at most at once (on one
    node, for Ray). Ray is imported only here, when a cluster is really used."""
    if isinstance(factory, RayCluster):
        from .ray_executor import RayEpisodeExecutor

        return RayEpisodeExecutor(config, max_episodes_per_node=max_workers, cluster=factory)
    return factory.start(config, max_workers=max_workers)


def make_executor(executor: ExecutorSpec, config: EpisodeConfig, *,
                  max_workers: int) -> EpisodeExecutor:
    """A started executor, for code that runs episodes without a vector env (an async rollout
    worker)."""
    return start_executor(executor_factory(executor), config, max_workers=max_workers)
