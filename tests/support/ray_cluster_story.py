"""The driver program of tests/test_ray_cluster.py: a training driver's life on a real cluster.

    python -m support.ray_cluster_story ROOT      (from tests/; prints one JSON object)

It starts a real multi-node Ray cluster on this machine under ROOT (`support.ray_cluster`): a
head with no rollout resources and rollout nodes `a` and `b` (2 CPUs, `rollout: 2`, label
`role=rollout`); `c` joins later. Two envs share it: A (generous timeouts) and B (an episode
deadline of 35 s). Then, chapter by chapter, it does what the tests assert on: a step spread
over nodes; a third env that cannot fit; node `b` killed mid-step; a step on the live node
only; `c` joins and gets work; `c` frozen while B's episode there talks to the model (B's
deadline ends it) and A, not knowing yet, sends it an episode that cannot start (re-run on `a`
once `c` is gone); a driver that exits without `close()`, its runner on the head (started while
B waits out its deadline, the story's one idle stretch); everything closed. Every chapter
records what it saw, or its traceback, and the next one runs anyway.

It runs as its own process (not inside pytest) because a driver is one: Ray allows one
connection per process, and its token and config are read once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from support.ray_cluster import LocalRayCluster, RayNode

ROLLOUT = {"resources": {"rollout": 2}, "labels": {"role": "rollout"}, "num_cpus": 2}
ASK = {"resources": {"rollout": 1}}  # each runner: 1 CPU (default) and one rollout slot
EPISODE = {"harness": "pi", "engine": "oracle", "progress": False}
# Shorter than Ray's ~65 s to call a frozen node dead, so the deadline is what ends B's episode.
# The freeze chapter waits it out whole, the story's longest wait (it was 50 s). Its floor: B's
# episode on `a` (Pi + oracle: ~8 s quiet, ~20 s at a load of 14; one over its own timeout ends
# `timeout`, allowed, never `infra_error`), and c's runner silent for more than `poll_s` + 15 s
# by then (its first model call, after which c freezes, comes ~10 s after the send at load 14).
B_DEADLINE = {"episode_timeout_s": 18.0, "test_timeout_s": 12.0, "deadline_margin_s": 5.0}
# A driver that crashes once its env is up: no close(), no atexit. Its runner goes on the node
# named by argv[2] (the head: the rollout slots are all held when it runs).
ORPHAN_DRIVER = textwrap.dedent("""
    import json, os, sys
    import gymnasium as gym, harness_gym
    from harness_gym.scaleout.ray_cluster import RayCluster
    envs = gym.make_vec("HarnessSWE-v0", vectorization_mode="vector_entry_point",
                        num_envs=1, harness="pi", engine="oracle", progress=False,
                        executor=RayCluster(address=sys.argv[1], poll_s=1.0,
                                            node_labels={"ray.io/node-id": sys.argv[2]}))
    envs.reset(seed=0)
    print(json.dumps(envs.unwrapped.executor.nodes), flush=True)
    os._exit(0)
""")


def wait_for(predicate, what: str, timeout: float = 240.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"waited {timeout:g} s for {what}")


class Story:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster = LocalRayCluster(root)
        self.facts: dict[str, Any] = {"errors": {}}
        self.runners_seen: dict[str, dict[str, Any]] = {}  # every runner any env reported
        self.envs: dict[str, Any] = {}
        self.nodes: list[RayNode] = []
        self.orphan: subprocess.Popen[str] | None = None

    # --- helpers --------------------------------------------------------------------------

    def name(self, node_id: str) -> str:
        for node in self.nodes:
            if node.node_id == node_id:
                return node.name
        return node_id[:12]

    def make_env(self, key: str, *, deadline: dict[str, float] | None = None, **cluster: Any):
        import gymnasium as gym

        import harness_gym  # noqa: F401
        from harness_gym.scaleout.ray_cluster import RayCluster

        timeouts = deadline or {"episode_timeout_s": 120.0, "test_timeout_s": 60.0,
                                "deadline_margin_s": 60.0}
        options = {"address": self.cluster.address, "actor_options": ASK, "poll_s": 1.0,
                   "start_timeout_s": 240.0, "deadline_margin_s": timeouts["deadline_margin_s"],
                   **cluster}
        envs = gym.make_vec(
            "HarnessSWE-v0", vectorization_mode="vector_entry_point", num_envs=2, group_size=2,
            episode_timeout_s=timeouts["episode_timeout_s"],
            test_timeout_s=timeouts["test_timeout_s"], executor=RayCluster(**options), **EPISODE)
        self.envs[key] = envs
        return envs

    def runner_nodes(self, key: str) -> list[str]:
        nodes = self.envs[key].unwrapped.executor.nodes
        for info in nodes:
            self.runners_seen[info["runner_id"]] = info
        return sorted(self.name(info["node_id"]) for info in nodes)

    def step(self, key: str, seed: int = 0) -> dict[str, Any]:
        envs = self.envs[key]
        envs.reset(seed=seed)
        executor = envs.unwrapped.executor
        done_before = len(executor.placements)
        started = time.monotonic()
        _, rewards, _, _, infos = envs.step(None)
        wall = time.monotonic() - started
        placements = executor.placements[done_before:]
        by_task_order = [{"task_id": p.task_id, "nodes": [self.name(n) for n in p.nodes],
                          "called": p.called, "outcome": p.outcome} for p in placements]
        return {"wall_s": wall, "outcomes": infos["outcome"].tolist(),
                "errors": [e for e in infos["error"].tolist() if e],
                "episodes": by_task_order}

    def step_in_background(self, key: str) -> tuple[threading.Thread, dict[str, Any]]:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["step"] = self.step(key)
            except BaseException as exc:  # noqa: BLE001 - reported by the chapter
                box["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread, box

    def finish(self, thread: threading.Thread, box: dict[str, Any], timeout: float = 300.0):
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError("the step did not return")
        if "error" in box:
            raise box["error"]
        return box["step"]

    def in_flight_on(self, key: str, node: RayNode, *, called: bool | None = None):
        episodes = self.envs[key].unwrapped.executor.in_flight()
        return [e for e in episodes if e.nodes and e.nodes[-1] == node.node_id
                and (called is None or e.called == called)]

    def leftovers(self, node: RayNode) -> dict[str, list]:
        """What runners left on a node: workspace dirs, and processes living in them."""
        from harness_gym.scaleout.runner_workspace import RUNNERS_DIR, workspace_pids

        base = node.tmp / RUNNERS_DIR
        dirs = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
        return {"dirs": dirs, "pids": workspace_pids(base) if base.is_dir() else []}

    def wait_clean(self, node: RayNode, timeout: float = 60.0) -> dict[str, Any]:
        started = time.monotonic()
        try:
            wait_for(lambda: self.leftovers(node) == {"dirs": [], "pids": []},
                     f"{node.name} to be clean", timeout=timeout, every=0.5)
        except TimeoutError:
            pass
        return {**self.leftovers(node), "after_s": time.monotonic() - started}

    # --- the chapters ---------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            for chapter in (self.start, self.spread, self.share, self.kill, self.live_only,
                            self.join, self.freeze, self.orphan_driver, self.close):
                started = time.monotonic()
                try:
                    chapter()
                except BaseException:  # noqa: BLE001 - recorded; the next chapter still runs
                    self.facts["errors"][chapter.__name__] = traceback.format_exc()
                self.facts.setdefault("chapter_s", {})[chapter.__name__] = round(
                    time.monotonic() - started, 1)
                if "start" in self.facts["errors"]:
                    break  # no cluster: every later chapter would wait out its timeouts
        finally:
            if self.orphan is not None and self.orphan.poll() is None:
                self.orphan.kill()
            for envs in self.envs.values():
                try:
                    envs.close()
                except Exception:  # noqa: BLE001 - the cluster goes below anyway
                    pass
            self.cluster.stop()
        return self.facts

    def start(self) -> None:
        os.environ.update(self.cluster.env)  # this driver speaks the cluster's token too
        head = self.cluster.start_head(num_cpus=1)
        a = self.cluster.add_node("a", **ROLLOUT)
        b = self.cluster.add_node("b", **ROLLOUT)
        self.nodes += [head, a, b]
        self.head, self.a, self.b = head, a, b

    def spread(self) -> None:
        envs = self.make_env("A", node_labels={"role": "rollout"})
        envs.reset(seed=0)
        self.facts["spread"] = {"runner_nodes": self.runner_nodes("A"), **self.step("A")}
        info = self.envs["A"].unwrapped.executor.nodes[0]
        self.facts["spread"]["workspace_under_node_tmp"] = info["workspace"].startswith(
            str(self.root))

    def share(self) -> None:
        started = time.monotonic()
        self.make_env("B", deadline=B_DEADLINE).reset(seed=0)  # A holds its runners meanwhile
        fact = {"reset_s": time.monotonic() - started, "runner_nodes": self.runner_nodes("B")}
        self.facts["share"] = fact
        # A third env asking for the same slot: A and B hold both rollout slots of a and b.
        from harness_gym.scaleout.ray_placement import RayPlacementError

        started = time.monotonic()
        try:
            self.make_env("C", start_timeout_s=1.0).reset(seed=0)
        except RayPlacementError as exc:
            fact["third_env_error"] = str(exc)
        fact["third_env_s"] = time.monotonic() - started
        self.envs.pop("C", None)

    def kill(self) -> None:
        thread, box = self.step_in_background("A")
        wait_for(lambda: self.in_flight_on("A", self.b, called=True), "a model call on b")
        wait_for(lambda: self.in_flight_on("A", self.a), "an episode on a")
        killed_at = time.monotonic()
        self.cluster.kill(self.b)
        step = self.finish(thread, box)
        self.facts["kill"] = {**step, "returned_after_kill_s": time.monotonic() - killed_at,
                              "b_left": self.wait_clean(self.b)}

    def live_only(self) -> None:
        wait_for(lambda: self.runner_nodes("A") == ["a"], "A to drop b's runner", timeout=60)
        self.facts["live_only"] = {"runner_nodes": self.runner_nodes("A"), **self.step("A")}

    def join(self) -> None:
        started = time.monotonic()
        self.c = self.cluster.add_node("c", **ROLLOUT)
        self.nodes.append(self.c)
        wait_for(lambda: "c" in self.runner_nodes("A"), "A to start a runner on c")
        self.facts["join"] = {"runner_after_s": time.monotonic() - started,
                              "runner_nodes": self.runner_nodes("A"), **self.step("A")}

    def freeze(self) -> None:
        wait_for(lambda: self.runner_nodes("B") == ["a", "c"], "B to start a runner on c")
        b_thread, b_box = self.step_in_background("B")
        wait_for(lambda: self.in_flight_on("B", self.c, called=True), "a model call on c")
        frozen_at = time.monotonic()
        self.cluster.freeze(self.c)
        # A has not noticed (its last heartbeat from c is fresh): it sends c an episode that
        # cannot start there, so it is lost before its first model call when c goes.
        a_thread, a_box = self.step_in_background("A")
        wait_for(lambda: self.in_flight_on("A", self.c), "an episode of A sent to c")
        self.start_orphan_driver()  # it starts up while B waits out its deadline
        b_step = self.finish(b_thread, b_box)
        returned = time.monotonic()
        import ray

        alive = [n["Alive"] for n in ray.nodes() if n["NodeID"] == self.c.node_id]
        self.cluster.kill(self.c)
        self.facts["freeze"] = {
            "B": {**b_step, "deadline_s": sum(B_DEADLINE.values()),
                  "returned_after_freeze_s": returned - frozen_at,
                  "c_alive_to_ray_at_return": alive == [True]},
            "A": self.finish(a_thread, a_box), "c_left": self.wait_clean(self.c)}

    def close(self) -> None:
        runners = {**self.runners_seen}
        for key in ("A", "B"):
            for info in self.envs[key].unwrapped.executor.nodes:
                runners[info["runner_id"]] = info
        for key in ("A", "B"):
            self.envs.pop(key).close()
        pids = [p for info in runners.values() for p in (info["pid"], info["guard_pid"])]

        def gone() -> bool:
            return not any(Path(f"/proc/{p}").exists() and _state(p) != "Z" for p in pids)

        try:
            wait_for(gone, "runner and guard processes to exit", timeout=60)
        except TimeoutError:
            pass
        self.facts["close"] = {
            "runners": len(runners),
            "alive": [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) != "Z"],
            "left": {n.name: self.wait_clean(n, timeout=30) for n in self.nodes}}

    def start_orphan_driver(self) -> None:
        self.orphan = subprocess.Popen(
            [sys.executable, "-c", ORPHAN_DRIVER, self.cluster.address, self.head.node_id],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **self.cluster.env})

    def orphan_driver(self) -> None:
        if self.orphan is None:  # the freeze chapter failed before starting it
            self.start_orphan_driver()
        out, err = self.orphan.communicate(timeout=300)
        if self.orphan.returncode != 0:
            raise RuntimeError(f"the orphan driver failed:\n{err[-4000:]}")
        nodes = json.loads(out.strip().splitlines()[-1])
        self.facts["orphan_driver"] = {
            "runner_nodes": sorted(self.name(n["node_id"]) for n in nodes),
            "workspaces": [n["workspace"] for n in nodes], "left": self.wait_clean(self.head)}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def main() -> None:
    root = Path(sys.argv[1])
    facts = Story(root).run()
    print(json.dumps(facts, default=str))


if __name__ == "__main__":
    main()
