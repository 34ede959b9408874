"""`RayEpisodeExecutor`: a vector step's episodes as calls to Ray actors, one `NodeRunner` a node.

On a cluster (not run as a doctest: it needs Ray nodes and a vLLM server; the tests run the
same on a local 2-CPU cluster)::

    import gymnasium as gym, harness_gym
    envs = gym.make_vec("HarnessSWE-v0", num_envs=64, vectorization_mode="vector_entry_point",
                        harness="pi", engine="vllm:http://10.0.0.5:8000", group_size=8,
                        executor="ray", ray_address="auto")
    problems, infos = envs.reset(seed=0)
    problems, rewards, terminated, truncated, infos = envs.step(None)   # 64 episodes, N nodes
    envs.close()                                     # kills the actors; disconnects from Ray

Why one actor per node and not one Ray task per episode: an episode is a CLI subprocess that
talks HTTP to a proxy on loopback, and a proxy is worth starting once, not per episode. Each
`NodeRunner` starts, inside its actor, the same stack the thread executor builds in-process
(engine, `InterceptionProxy`, sandbox backend, one `EpisodeRunner` per harness) and runs its
episodes on threads (a threaded actor, `max_concurrency` = episodes it may hold at once), so the
episodes on a node share its proxy and engine exactly as they do locally.

The engine travels as a spec string and each actor loads it itself. On a real cluster use
`vllm:URL`: every node's proxy then samples from the same vLLM servers, the ones the trainer
updates. `tiny` or `oracle` load a private CPU model in every actor, which is what the local tests
want and nothing else does. Tasks travel with each call; a task's `repo_dir` (the `builtin` suite,
a task directory) must exist at the same path on every node, as an installed package or a shared
filesystem does; JSONL rows run in container images and need nothing local.

Dispatch goes to the actor with the fewest episodes in flight (ties: round-robin). An actor
returns the `EpisodeResult` itself (Ray pickles it, typed trace and all), so `info()` is built
on the driver exactly as with threads.
A lost actor or node becomes that episode's `infra_error` outcome, not an exception in `step()`.

`close()` asks every actor to release what it started (proxy, sandboxes, repos, engine), kills
the actors, and calls `ray.shutdown()` only if this executor called `ray.init()`.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import uuid
from concurrent.futures import Future
from typing import Any

from .config import EpisodeConfig
from .engines import Engine
from .episode import EpisodeRequest, EpisodeResult, EpisodeStack

log = logging.getLogger(__name__)

ACTOR_NAMESPACE = "harness-gym"
# A local cluster started for us: no dashboard (an HTTP server and ~100 MB per node we never use)
# and no log forwarding (the CLIs' stderr would interleave with the trainer's output).
LOCAL_INIT_DEFAULTS: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
CLOSE_TIMEOUT_S = 60.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor='ray' needs Ray: pip install 'harness-gym[ray]'") from exc
    return ray


class NodeRunner:
    """One node's episode stack: engine (loaded here from its spec), proxy, sandbox backend, and
    one `EpisodeRunner` per harness (an `EpisodeStack`). The executor runs it as a threaded Ray
    actor.
    """

    def __init__(self, config: EpisodeConfig) -> None:
        self.stack = EpisodeStack(config)

    def describe(self) -> dict[str, Any]:
        """Where this runner lives: pid, hostname and proxy URL (also a readiness probe)."""
        return {"pid": os.getpid(), "host": os.uname().nodename,
                "proxy_url": self.stack.proxy.url, "engine": self.stack.engine.model_name,
                "harnesses": sorted(self.stack.runners)}

    def run(self, request: EpisodeRequest) -> EpisodeResult:
        return self.stack.run(request)

    def close(self) -> None:
        self.stack.close()


class RayEpisodeExecutor:
    """Runs episodes on one `NodeRunner` actor per alive node with CPUs; see the module docstring.

    An `EpisodeExecutor` (`harness_gym.executors`): `submit()` answers a
    `concurrent.futures.Future` of an `EpisodeResult`, as the thread executor does.
    """

    def __init__(
        self,
        config: EpisodeConfig,
        *,
        max_episodes_per_node: int,
        address: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(config.engine, str):
            raise TypeError(
                "executor='ray' ships the engine to every node as a spec string (e.g. "
                f"'vllm:http://host:8000'), got a {type(config.engine).__name__} object"
            )
        self._ray = ray = import_ray()
        self._config = config
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            kwargs = dict(init_kwargs or {})
            if address is None:
                kwargs = {**LOCAL_INIT_DEFAULTS, **kwargs}
            ray.init(address=address, **kwargs)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options = {"num_cpus": 1, **(actor_options or {})}
        nodes = [n["NodeID"] for n in ray.nodes()
                 if n["Alive"] and n["Resources"].get("CPU", 0) >= options["num_cpus"]]
        self._lock = threading.Lock()
        self._actors: list[Any] = []
        self._in_flight: list[int] = []
        self._cursor = itertools.count()
        self.actor_names: list[str] = []
        self.nodes: list[dict[str, Any]] = []
        try:
            if not nodes:
                raise RuntimeError(f"no alive Ray node has the {options['num_cpus']} CPU(s) a "
                                   "NodeRunner asks for; see `ray status`")
            remote = ray.remote(NodeRunner)
            run_id = uuid.uuid4().hex[:8]
            self.actor_names = [f"node-runner-{run_id}-{node[:12]}" for node in nodes]
            for node, name in zip(nodes, self.actor_names):
                self._actors.append(remote.options(
                    name=name, namespace=ACTOR_NAMESPACE,
                    # +1: describe() and close() never queue behind a full node's episodes
                    max_concurrency=max_episodes_per_node + 1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                    **options,
                ).remote(config))
            self._in_flight = [0] * len(self._actors)
            # Wait for every node's stack, so a bad spec fails here and not mid-step.
            self.nodes = ray.get([a.describe.remote() for a in self._actors])
        except BaseException:
            self.close()
            raise

    def submit(self, request: EpisodeRequest) -> Future[EpisodeResult]:
        with self._lock:
            if not self._actors:
                raise RuntimeError("the Ray executor is closed")
            cursor = next(self._cursor)
            n = len(self._actors)
            k = min(range(n), key=lambda i: (self._in_flight[i], (i - cursor) % n))
            self._in_flight[k] += 1
            ref = self._actors[k].run.remote(request)
        done: Future[EpisodeResult] = Future()

        def finish(raw: Future[EpisodeResult]) -> None:
            with self._lock:
                self._in_flight[k] -= 1
            try:
                done.set_result(raw.result())
            except Exception as exc:  # noqa: BLE001 - actor or node lost: an infra_error outcome
                log.warning("episode of %s on %s lost in Ray: %s", request.harness,
                            request.task.instance_id, exc)
                done.set_result(EpisodeResult.never_ran(request, self._config.reward,
                                                        f"{type(exc).__name__}: {exc}"))

        ref.future().add_done_callback(finish)
        return done

    @property
    def engine(self) -> Engine:
        raise AttributeError("with executor='ray' each node's actor loads its own engine")

    def close(self) -> None:
        """Release every node's stack, kill the actors, and shut Ray down if we started it."""
        ray = self._ray
        actors, self._actors = self._actors, []
        if actors:
            closing = [a.close.remote() for a in actors]
            try:  # a clean close stops proxies and engines before the actors die
                ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the kill below ends them either way
                log.warning("closing the node runners: %s", exc)
            for actor in actors:
                ray.kill(actor, no_restart=True)
        if self._owns_ray:
            self._owns_ray = False
            ray.shutdown()
