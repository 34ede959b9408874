"""Where a vector step's episodes run: the `EpisodeExecutor` protocol and its local threads.

`HarnessVectorEnv` hands every episode of a step to an executor and gathers the futures; it does
not know where they run. `ThreadEpisodeExecutor` runs them on threads in this process around one
`EpisodeStack` (one engine, one proxy); `harness_gym.ray_executor.RayEpisodeExecutor` runs them
on Ray actors, one stack per node. Both are built from the same `EpisodeConfig`.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, Protocol

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


def make_executor(
    name: ExecutorName,
    config: EpisodeConfig,
    *,
    max_workers: int,
    ray_address: str | None = None,
    ray_init: dict[str, Any] | None = None,
) -> EpisodeExecutor:
    """The executor `HarnessVectorEnv(executor=...)` names."""
    if name == "threads":
        return ThreadEpisodeExecutor(config, max_workers=max_workers)
    if name == "ray":
        from .ray_executor import RayEpisodeExecutor

        return RayEpisodeExecutor(config, max_episodes_per_node=max_workers,
                                  address=ray_address, init_kwargs=ray_init)
    raise ValueError(f"executor is 'threads' or 'ray', got {name!r}")
