"""`RayEpisodeExecutor`: a vector step's episodes on Ray, one `NodeRunner` actor per node, following
the cluster as nodes come, go and fall silent.

On a cluster (not run as a doctest: it needs Ray nodes and a vLLM server; tests/test_ray_cluster.py
runs it on a real multi-node cluster on one machine; docs/scale-out.md is the how-to)::

    import gymnasium as gym, harness_gym
    from harness_gym.scaleout.ray_executor import RayCluster
    envs = gym.make_vec("HarnessSWE-v0", num_envs=64, vectorization_mode="vector_entry_point",
                        harness="pi", engine="vllm:http://10.0.0.5:8000", group_size=8,
                        executor=RayCluster(address="auto",
                                            actor_options={"resources": {"rollout": 1}}))
    problems, infos = envs.reset(seed=0)
    problems, rewards, terminated, truncated, infos = envs.step(None)   # 64 episodes, N nodes
    envs.close()                                     # kills the actors; disconnects from Ray

`executor="ray"` is `RayCluster()` (a local cluster, or `ray_address=` to join one); see
`harness_gym.scaleout.ray_cluster` for every choice.

Why one actor per node and not one Ray task per episode: an episode is a CLI subprocess that talks
HTTP to a proxy on loopback, and a proxy is worth starting once, not per episode; see
`harness_gym.scaleout.node_runner`. The engine travels as a spec string and each runner loads it
itself: on a real cluster `vllm:URL`, so every node samples from the servers the trainer updates. A
task's `repo_dir` must exist at the same path on every node (an installed package, a shared
filesystem); JSONL rows run in container images and need nothing local.

What the executor does, on one thread of its own (every change of state happens there; `submit`,
`close` and Ray's callbacks only post to it):

- **Placement.** Every `poll_s` it reads `ray.nodes()` and the nodes' free resources and starts a
  runner on each alive node that carries `node_labels` and has the runner's resources
  (`actor_options`, default one CPU) free now (`harness_gym.scaleout.ray_placement`). A busy node is
  left to the env holding it; with no node able to take a runner within `start_timeout_s`,
  start-up fails with `RayPlacementError`, saying node by node what is missing.
- **Membership.** A runner whose node left the cluster, whose actor died, or which did not get
  ready in `start_timeout_s` is dropped (its actor killed) and its node rested (`retry_s`, doubling
  to 10 min) before the next try; a node that joins gets a runner at the next poll.
- **Dispatch.** An episode goes to the live runner with the fewest episodes in flight (ties:
  round-robin), at most `max_episodes_per_node` at once; it waits in a queue while no runner
  can take it (at most `start_timeout_s`, then `infra_error`).
- **Lost episodes.** The episodes of a dropped runner that had not made a model call (each
  runner reports that through a long poll, `NodeRunner.watch`) are re-run on a live runner (at
  most `max_reruns` times); those that had are `infra_error`.
- **Deadlines.** An episode ends by `episode_timeout_s + test_timeout_s + deadline_margin_s`
  after it was sent, or it is `infra_error` then: a frozen node keeps its connections open, and
  Ray took 64 s to call one dead (measured). A runner that is silent (no heartbeat for
  `poll_s + 15` s) past an episode's deadline is dropped; a silent runner gets no new episodes.

Every future resolves to an `EpisodeResult`: a lost, late or undeliverable episode is an
`infra_error` result whose `error` says why, never an exception in `step()`. `placements` logs
where each episode ran. `close()` asks every answering runner to release what it started,
kills all of them, and disconnects from Ray if executors opened the connection and this is the
last of them to close (a connection the caller opened stays).
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..config import EpisodeConfig
from ..engines import Engine
from ..episode import EpisodeRequest, EpisodeResult
from .node_runner import NodeRunner
from .ray_cluster import EpisodePlacement, RayCluster
from .ray_placement import NodeFit, RayPlacementError, fit_nodes, placement_report, runner_demand

log = logging.getLogger(__name__)

ACTOR_NAMESPACE = "harness-gym"
# A local cluster started for us: no dashboard (an HTTP server and ~100 MB per node we never use)
# and no log forwarding (the CLIs' stderr would interleave with the trainer's output).
LOCAL_INIT_DEFAULTS: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
CLOSE_TIMEOUT_S = 30.0
SILENCE_GRACE_S = 15.0  # beyond poll_s: a loaded node answers its long poll late, not never
MAX_NODE_REST_S = 600.0  # a node whose runners keep failing waits at most this long

T = TypeVar("T")


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor='ray' needs Ray: pip install 'harness-gym[ray]'") from exc
    return ray


@dataclass(eq=False)
class _Episode:
    key: str
    request: EpisodeRequest
    future: Future[EpisodeResult]
    queued_at: float
    runner: _Runner | None = None
    nodes: list[str] = field(default_factory=list)
    deadline: float = math.inf
    called: bool = False
    done: bool = False

    def placement(self, outcome: str | None) -> EpisodePlacement:
        return EpisodePlacement(self.key, self.request.task.instance_id, self.request.harness,
                                tuple(self.nodes), self.called, outcome)


@dataclass(eq=False)
class _Runner:
    node_id: str
    name: str
    actor: Any
    started: float
    info: dict[str, Any] | None = None  # its describe(), once ready
    heartbeat: float = 0.0
    episodes: dict[str, _Episode] = field(default_factory=dict)
    called: list[str] = field(default_factory=list)  # keys that made a call, as last reported


class RayEpisodeExecutor:
    """Runs episodes on one `NodeRunner` actor per suitable node; see the module docstring.

    An `EpisodeExecutor` (`harness_gym.scaleout.executors`): `submit()` answers a
    `concurrent.futures.Future` of an `EpisodeResult`, as the thread executor does. The
    constructor returns once the runners it started are ready (or failed, if one is ready).
    """

    def __init__(
        self,
        config: EpisodeConfig,
        *,
        max_episodes_per_node: int,
        cluster: RayCluster | None = None,
    ) -> None:
        if not isinstance(config.engine, str):
            raise TypeError(
                "executor='ray' ships the engine to every node as a spec string (e.g. "
                f"'vllm:http://host:8000'), got a {type(config.engine).__name__} object"
            )
        self.cluster = cluster = cluster or RayCluster()
        self._ray = ray = import_ray()
        self._config = config
        self._capacity = max_episodes_per_node
        self._deadline_s = cluster.deadline_s(config)
        self._silence_s = cluster.poll_s + SILENCE_GRACE_S
        self._demand = runner_demand(cluster.actor_options)
        self._connection = _connect(ray, cluster)
        self._remote = ray.remote(NodeRunner)
        self._id = uuid.uuid4().hex[:8]
        self._runners: dict[str, _Runner] = {}  # node id -> its runner
        self._queue: deque[_Episode] = deque()
        self._rest: dict[str, tuple[float, float]] = {}  # node id -> (retry at, next rest)
        self._failures: dict[str, str] = {}  # node id -> why its last runner failed
        self._fits: list[NodeFit] | None = None
        self._events: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._keys = itertools.count()
        self._cursor = itertools.count()
        self._warned_waiting = False
        self._stops = 0  # stop_running calls so far (`_stop_running`)
        self._placements: deque[EpisodePlacement] = deque(maxlen=10_000)
        self._closed = False
        self._started: Future[None] = Future()
        self._start_by = time.monotonic() + cluster.start_timeout_s
        self._thread = threading.Thread(target=self._loop, name="harness-gym-ray", daemon=True)
        self._thread.start()
        try:
            self._started.result(timeout=cluster.start_timeout_s + 60)
        except BaseException:
            self.close()
            raise

    # --- the EpisodeExecutor protocol ----------------------------------------------------

    def submit(self, request: EpisodeRequest) -> Future[EpisodeResult]:
        if self._closed:
            raise RuntimeError("the Ray executor is closed")
        episode = _Episode(f"{self._id}-{next(self._keys)}", request, Future(), time.monotonic())
        self._events.put(lambda: self._queue.append(episode))
        return episode.future

    @property
    def engine(self) -> Engine:
        raise AttributeError("with executor='ray' each node's runner loads its own engine")

    def stop_running(self) -> None:
        """End the running episodes now: each node's runner stops its own (its CLIs killed,
        an `infra_error` within about a second, as with threads); queued ones never start;
        episodes submitted later run."""
        if not self._closed:
            self._ask(self._stop_running)

    def close(self) -> None:
        """Release every answering runner's stack, kill all runners, disconnect from Ray if
        executors connected (and this is the last). Pending episodes become `infra_error`.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._events.put(None)
        self._thread.join(timeout=30)
        now = time.monotonic()
        runners, self._runners = list(self._runners.values()), {}
        for episode in [*self._queue, *(e for r in runners for e in r.episodes.values())]:
            self._resolve(episode, self._infra_error(episode, "the Ray executor was closed"))
        self._queue.clear()
        ray = self._ray
        answering = [r for r in runners if r.info is not None
                     and now - r.heartbeat <= self._silence_s]
        closing = [r.actor.close.remote() for r in answering]
        try:  # a clean close stops proxies and engines before the actors die
            if closing:
                ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the kill below ends them either way
            log.warning("closing the node runners: %s", exc)
        for runner in runners:
            self._kill(runner)
        if self._connection is not None:
            generation, self._connection = self._connection, None
            _disconnect(ray, generation)

    # --- what users and tests may look at ------------------------------------------------

    @property
    def nodes(self) -> list[dict[str, Any]]:
        """The ready runners, as each describes itself (node id, pid, proxy URL, ...)."""
        return self._ask(lambda: [dict(r.info) for r in self._runners.values() if r.info])

    @property
    def actor_names(self) -> list[str]:
        return self._ask(lambda: [r.name for r in self._runners.values()])

    @property
    def placements(self) -> list[EpisodePlacement]:
        """The finished episodes (the latest 10,000), in the order they finished."""
        return self._ask(lambda: list(self._placements))

    def in_flight(self) -> list[EpisodePlacement]:
        """The episodes sent to a runner and not finished, with their nodes."""
        return self._ask(lambda: [e.placement(None) for r in self._runners.values()
                                  for e in r.episodes.values() if not e.done])

    def _ask(self, question: Callable[[], T]) -> T:
        """`question()` answered on the executor's thread (it owns the state)."""
        if not self._thread.is_alive():
            return question()
        answer: Future[T] = Future()

        def ask() -> None:
            try:
                answer.set_result(question())
            except Exception as exc:  # noqa: BLE001 - handed back to the caller
                answer.set_exception(exc)

        self._events.put(ask)
        return answer.result(timeout=60)

    # --- the executor's thread -----------------------------------------------------------

    def _loop(self) -> None:
        next_poll = 0.0
        while True:
            try:
                events = [self._events.get(timeout=min(1.0, self.cluster.poll_s))]
            except queue.Empty:
                events = []
            while not self._events.empty():
                events.append(self._events.get_nowait())
            for event in events:
                if event is None:
                    return
                self._guarded(event)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + self.cluster.poll_s
                self._guarded(lambda: self._refresh(now))
            self._guarded(lambda: self._expire(now))
            self._guarded(lambda: self._dispatch(now))
            self._guarded(lambda: self._check_started(now))

    @staticmethod
    def _guarded(step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:  # the loop must outlive a bad answer from Ray
            log.exception("the Ray executor's loop")

    def _when_done(self, ref: Any, then: Callable[[Future[Any]], None]) -> None:
        """Run `then(future)` on the executor's thread when the object ref resolves."""
        ref.future().add_done_callback(lambda f: self._events.put(lambda: then(f)))

    def _refresh(self, now: float) -> None:
        """Follow the cluster: drop runners of dead nodes and stuck starts; start runners."""
        nodes = self._ray.nodes()
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        for runner in list(self._runners.values()):
            if runner.node_id not in alive:
                self._drop(runner, "its node left the cluster", now)
            elif runner.info is None and now - runner.started > self.cluster.start_timeout_s:
                self._drop(runner, (
                    f"not ready after start_timeout_s={self.cluster.start_timeout_s:g}: its node "
                    "had no free resources for it, or loading the engine or installing the "
                    "harness took longer"), now, failed=True)
        self._fits = fit_nodes(nodes, _free_resources(self._ray), self._demand,
                               self.cluster.node_labels)
        for fit in self._fits:
            resting = self._rest.get(fit.node_id, (0.0, 0.0))[0] > now
            if fit.fits_now and fit.node_id not in self._runners and not resting:
                self._start_runner(fit.node_id, now)

    def _start_runner(self, node_id: str, now: float) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = f"node-runner-{self._id}-{node_id[:12]}-{next(self._keys)}"
        actor = self._remote.options(
            name=name, namespace=ACTOR_NAMESPACE, max_restarts=0,
            # +2: watch() and close() (or stop_running()) never queue behind a full node's episodes
            max_concurrency=self._capacity + 2,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **{"num_cpus": 1, **self.cluster.actor_options},
        ).remote(self._config, name)
        runner = _Runner(node_id, name, actor, now)
        self._runners[node_id] = runner
        self._when_done(actor.describe.remote(), lambda f: self._on_ready(runner, f))

    def _current(self, runner: _Runner) -> bool:
        return self._runners.get(runner.node_id) is runner

    def _on_ready(self, runner: _Runner, answer: Future[dict[str, Any]]) -> None:
        if not self._current(runner):
            return
        now = time.monotonic()
        try:
            runner.info = answer.result()
        except Exception as exc:  # noqa: BLE001 - its constructor raised, or it died starting
            self._drop(runner, f"could not start: {_last_line(exc)}", now, failed=True)
            return
        runner.heartbeat = now
        self._failures.pop(runner.node_id, None)
        self._rest.pop(runner.node_id, None)
        log.info("node runner %s ready on node %s (pid %s)", runner.name, runner.node_id[:12],
                 runner.info.get("pid"))
        self._watch(runner)

    def _watch(self, runner: _Runner) -> None:
        ref = runner.actor.watch.remote(runner.called, self.cluster.poll_s)
        self._when_done(ref, lambda f: self._on_watch(runner, f))

    def _on_watch(self, runner: _Runner, answer: Future[dict[str, list[str]]]) -> None:
        if not self._current(runner):
            return
        now = time.monotonic()
        try:
            report = answer.result()
        except self._ray.exceptions.RayActorError as exc:
            self._drop(runner, _last_line(exc), now)
            return
        except Exception as exc:  # noqa: BLE001 - a failed poll; the next one may get through
            log.warning("heartbeat of node runner %s: %s", runner.name, _last_line(exc))
        else:
            runner.heartbeat = now
            runner.called = report["called"]
            for key in runner.called:
                if key in runner.episodes:
                    runner.episodes[key].called = True
        self._watch(runner)

    def _dispatch(self, now: float) -> None:
        while self._queue:
            runner = self._pick(now)
            if runner is None:
                break
            self._send(self._queue.popleft(), runner, now)
        for episode in [e for e in self._queue if now - e.queued_at > self.cluster.start_timeout_s]:
            self._queue.remove(episode)
            self._resolve(episode, self._infra_error(episode, (
                f"no live Ray node runner took it within start_timeout_s="
                f"{self.cluster.start_timeout_s:g}:\n{self._report()}")))

    def _pick(self, now: float) -> _Runner | None:
        live = [r for r in self._runners.values() if r.info is not None
                and now - r.heartbeat <= self._silence_s and len(r.episodes) < self._capacity]
        if not live:
            return None
        cursor, n = next(self._cursor), len(live)
        return min(enumerate(live), key=lambda ir: (len(ir[1].episodes), (ir[0] - cursor) % n))[1]

    def _send(self, episode: _Episode, runner: _Runner, now: float) -> None:
        episode.runner, episode.called, episode.deadline = runner, False, now + self._deadline_s
        episode.nodes.append(runner.node_id)
        runner.episodes[episode.key] = episode
        ref = runner.actor.run.remote(episode.request, episode.key, self._stops)
        self._when_done(ref, lambda f: self._on_result(runner, episode, f))

    def _on_result(self, runner: _Runner, episode: _Episode, answer: Future[EpisodeResult]) -> None:
        try:
            result = answer.result()
        except self._ray.exceptions.RayActorError as exc:
            if self._current(runner):
                self._drop(runner, _last_line(exc), time.monotonic())  # re-runs or fails it
                return
            result = self._infra_error(episode, _last_line(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. the result could not be unpickled here
            result = self._infra_error(episode, f"{type(exc).__name__}: {_last_line(exc)}")
        runner.episodes.pop(episode.key, None)
        if episode.runner is runner:
            self._resolve(episode, result)

    def _expire(self, now: float) -> None:
        for runner in list(self._runners.values()):
            late = [e for e in runner.episodes.values()
                    if not e.done and e.runner is runner and now >= e.deadline]
            if not late:
                continue
            silent = now - runner.heartbeat > self._silence_s
            why = (f"no heartbeat for {now - runner.heartbeat:.0f} s: the node is silent"
                   if silent else "the node still answers; the episode is stuck there")
            for episode in late:
                self._resolve(episode, self._infra_error(episode, (
                    f"no result from Ray node {runner.node_id[:12]} within the episode deadline "
                    f"of {self._deadline_s:g} s (episode_timeout_s + test_timeout_s + "
                    f"deadline_margin_s); {why}")))
            if silent:
                self._drop(runner, "silent past an episode's deadline", now)

    def _drop(self, runner: _Runner, why: str, now: float, *, failed: bool = False) -> None:
        """Forget a runner, kill its actor, rest its node; re-run or fail its episodes."""
        if self._current(runner):
            del self._runners[runner.node_id]
        node = runner.node_id
        log.warning("dropping node runner %s on node %s: %s", runner.name, node[:12], why)
        if failed:
            self._failures[node] = why
        rest = self._rest.get(node, (0.0, self.cluster.retry_s))[1]
        self._rest[node] = (now + rest, min(2 * rest, MAX_NODE_REST_S))
        self._kill(runner)
        episodes, runner.episodes = list(runner.episodes.values()), {}
        for episode in episodes:
            if episode.done or episode.runner is not runner:
                continue
            if not episode.called and len(episode.nodes) <= self.cluster.max_reruns:
                log.warning("re-running %s on another node: lost with node %s before its first "
                            "model call", episode.request.task.instance_id, node[:12])
                episode.runner, episode.deadline, episode.queued_at = None, math.inf, now
                self._queue.append(episode)
            else:
                when = ("after its first model call" if episode.called
                        else f"after {len(episode.nodes)} tries")
                self._resolve(episode, self._infra_error(
                    episode, f"lost with Ray node {node[:12]} {when}: {why}"))

    def _stop_running(self) -> None:
        for episode in self._queue:
            self._resolve(episode, self._infra_error(episode, "stopped before it started"))
        self._queue.clear()
        # An actor's calls run on its threads in no fixed order: an episode sent before this
        # stop may begin after it. Each is sent with the stops so far, and a runner refuses
        # one sent before the stop it has been told of (`NodeRunner.run`).
        self._stops += 1
        for runner in self._runners.values():
            if runner.info is not None:  # a runner still starting has no episode yet
                runner.actor.stop_running.remote(self._stops)  # the actor's spare thread

    def _kill(self, runner: _Runner) -> None:
        try:
            self._ray.kill(runner.actor, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - already gone
            log.debug("killing %s: %s", runner.name, exc)

    def _check_started(self, now: float) -> None:
        if self._started.done() or self._fits is None:
            return
        ready = [r for r in self._runners.values() if r.info is not None]
        starting = [r for r in self._runners.values() if r.info is None]
        if ready and not starting:
            self._started.set_result(None)
            return
        hosts = [f for f in self._fits if f.can_host]
        hopeless = not starting and not ready and (
            not hosts or all(f.node_id in self._failures for f in hosts))
        if not hopeless and now < self._start_by:
            if not starting and not ready and not self._warned_waiting:
                self._warned_waiting = True
                log.warning("waiting up to %g s for a Ray node that can take a node runner:\n%s",
                            self._start_by - now, self._report())
            return
        if ready:
            self._started.set_result(None)
            return
        self._started.set_exception(RayPlacementError(
            "no Ray node runner could start"
            + ("" if hopeless else f" within start_timeout_s={self.cluster.start_timeout_s:g}")
            + f":\n{self._report()}\nFree or add resources (`ray status`), ask for less "
            "(ray_actor_options={'num_cpus': ...}), or start nodes that match (`ray start "
            "--resources=... --labels=...`); see docs/scale-out.md"))

    def _report(self) -> str:
        return placement_report(self._fits or [], self._demand, self.cluster.node_labels,
                                self._failures)

    def _infra_error(self, episode: _Episode, error: str) -> EpisodeResult:
        return EpisodeResult.never_ran(episode.request, self._config.reward, error)

    def _resolve(self, episode: _Episode, result: EpisodeResult) -> None:
        if episode.done:
            return
        episode.done = True
        self._placements.append(episode.placement(result.outcome))
        if not episode.future.done():
            episode.future.set_result(result)


# Ray allows one connection per process. Executors that found none open one and share it; the
# last of them to close shuts it down (a connection the caller opened is the caller's). The
# generation tells a connection someone else shut down meanwhile from the current one.
_connection_lock = threading.Lock()
_connection_generation = 0
_connection_users = 0


def _connect(ray: Any, cluster: RayCluster) -> int | None:
    """Connect to the cluster unless the caller did: the generation of the connection this
    executor shares, or None when it is the caller's."""
    global _connection_generation, _connection_users
    with _connection_lock:
        if ray.is_initialized():
            if _connection_users == 0:
                return None
        else:
            kwargs = dict(cluster.init_kwargs)
            if cluster.address is None:
                kwargs = {**LOCAL_INIT_DEFAULTS, **kwargs}
            ray.init(address=cluster.address, **kwargs)
            _connection_generation += 1
            _connection_users = 0
        _connection_users += 1
        return _connection_generation


def _disconnect(ray: Any, generation: int) -> None:
    global _connection_users
    with _connection_lock:
        if generation != _connection_generation:
            return  # shut down by someone else; a newer connection is not ours to count
        _connection_users -= 1
        if _connection_users == 0:
            ray.shutdown()


def _free_resources(ray: Any) -> dict[str, dict[str, float]]:
    """Free resources per alive node (Ray's developer API; totals where it is missing)."""
    try:
        from ray._private.state import available_resources_per_node

        return available_resources_per_node()
    except (ImportError, AttributeError):
        return {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}


def _last_line(exc: BaseException) -> str:
    """The line of a Ray error that says what happened (its message ends with the cause)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:500]
