"""`NodeRunner`: one node's episode stack, run by `RayEpisodeExecutor` as a threaded Ray actor.

It starts, inside its actor, the same stack the thread executor builds in-process (engine loaded
from its spec, `InterceptionProxy`, sandbox backend, one `EpisodeRunner` per harness) and runs
its episodes on the actor's threads, so the episodes on a node share its proxy and engine
exactly as they do locally. It can be used without Ray too (the tests build one directly).

Two things only a runner on its node can do:

- **Say which episodes have made a model call.** `watch()` answers, as soon as it changes (a
  long poll that also serves as the runner's heartbeat), the keys of the episodes whose proxy
  session has seen a call. When the node is lost, the executor re-runs the episodes that had
  none (nothing of the policy was spent on them) and reports the others as `infra_error`.
- **Leave nothing behind.** Its files live in a `RunnerWorkspace`
  (`harness_gym.scaleout.runner_workspace`) whose guard kills its CLIs and removes the directory
  when the runner's process dies, however it dies; starting a runner reaps what dead runners
  left on the node.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..config import EpisodeConfig
from ..episode import EpisodeRequest, EpisodeResult, EpisodeStack
from ..proxy.sessions import ProxySession
from .runner_workspace import RunnerWorkspace

WATCH_TICK_S = 0.1  # how often a watch looks at its sessions
_STOPPED = threading.Event()  # the `stopping` of an episode sent before a stop
_STOPPED.set()


class NodeRunner:
    """One node's episode stack (see the module docstring). `runner_id` names its workspace."""

    def __init__(self, config: EpisodeConfig, runner_id: str) -> None:
        self.runner_id = runner_id
        self.workspace = RunnerWorkspace.claim(runner_id)
        try:
            self.stack = EpisodeStack(config)  # its temp dirs now go under the workspace
        except BaseException:
            self.workspace.release()
            raise
        self._sessions: dict[str, ProxySession | None] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._stops = 0  # the executor's stop count this runner has been told of

    def describe(self) -> dict[str, Any]:
        """Where this runner lives (also the executor's readiness probe)."""
        return {"runner_id": self.runner_id, "node_id": _ray_node_id(), "pid": os.getpid(),
                "host": os.uname().nodename, "proxy_url": self.stack.proxy.url,
                "engine": self.stack.engine.model_name, "harnesses": sorted(self.stack.runners),
                "workspace": str(self.workspace.path), "guard_pid": self.workspace.guard_pid}

    def run(self, request: EpisodeRequest, key: str, stops: int = 0) -> EpisodeResult:
        """Run one episode; `key` is how `watch()` names it. `stops` is how many times the
        executor had stopped its episodes when it sent this one: one sent before a stop this
        runner has been told of never starts (an `infra_error`), whenever Ray begins it."""
        with self._lock:  # the stop count and the stack's event are read together
            stopping = self.stack.stopping if stops >= self._stops else _STOPPED
            self._sessions[key] = None

        def opened(session: ProxySession) -> None:
            with self._lock:
                self._sessions[key] = session

        try:
            return self.stack.run(request, on_session=opened, stopping=stopping)
        finally:
            with self._lock:
                self._sessions.pop(key, None)

    def called(self) -> set[str]:
        """Keys of the running episodes whose session has seen a model call (one in progress
        counts)."""
        with self._lock:
            sessions = list(self._sessions.items())
        return {key for key, s in sessions
                if s is not None and (s.trace.calls or s.calls_in_flight > 0)}

    def watch(self, known: list[str], timeout_s: float) -> dict[str, list[str]]:
        """Wait until an episode not in `known` has made a model call, or `timeout_s`; then say
        which episodes run and which of them have made a call."""
        seen = set(known)
        deadline = time.monotonic() + timeout_s
        while True:
            called = self.called()
            if called - seen or time.monotonic() >= deadline or self._closed.is_set():
                with self._lock:
                    running = sorted(self._sessions)
                return {"running": running, "called": sorted(called)}
            self._closed.wait(WATCH_TICK_S)

    def stop_running(self, stops: int | None = None) -> None:
        """End this node's running episodes now (`EpisodeStack.stop_running`: each an
        `infra_error`, its CLI killed), and those the executor sent before its `stops`-th stop
        that have not begun yet; later ones run."""
        with self._lock:
            if stops is not None:
                self._stops = max(self._stops, stops)
            self.stack.stop_running()

    def close(self) -> None:
        """Release the stack (proxy, sandboxes, engine), then the workspace and its guard."""
        self._closed.set()
        try:
            self.stack.close()
        finally:
            self.workspace.release()


def _ray_node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - outside Ray, or an old Ray: the node is unknown
        return None
