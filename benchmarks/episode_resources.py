"""What one concurrent episode costs a machine: CPU seconds and peak memory, per harness.

    python benchmarks/episode_resources.py [--harness pi,opencode] [--concurrent 4]

Each harness runs `--concurrent` episodes at once in one vector env (the oracle engine, so the
policy costs nothing and what is measured is the CLI, its sandbox, git and the task's tests) on
built-in tasks. Measured per step: the CPU seconds of this process and every process the step started,
divided by the number of episodes: from a cpuacct cgroup this process moves itself into (cgroup
v1, root; every descendant inherits it, wherever the sandbox puts them for its caps), else from
rusage (which misses processes nobody waited for: `method` in the results says which);
and the peak resident memory of everything below this process, sampled every 0.1 s (the sum of
RSS over the process tree: shared pages count once per process, so it is an upper bound).
CPU seconds and memory depend little on how loaded the machine is (wall time does), so the
figures size a machine: cores = episodes in flight x CPU seconds / episode wall time.
Writes benchmarks/results/episode_resources.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from pathlib import Path

import gymnasium as gym

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

RESULTS = Path(__file__).resolve().parent / "results" / "episode_resources.json"
PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and every process below it."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue  # it ended while we looked
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


class PeakMemory:
    """Samples the process tree's RSS in a thread; `peak` is the largest sum seen."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))

    def __enter__(self) -> PeakMemory:
        self.peak = tree_rss_bytes(os.getpid())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def cpu_account() -> tuple[str, Path | None]:
    """Move this process into a fresh cpuacct cgroup where that works (before any thread or
    child starts)."""
    group = CPUACCT / f"harness-gym-bench-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return "rusage", None
    return "cpuacct cgroup", group


def cpu_seconds(group: Path | None) -> float:
    if group is not None:
        return int((group / "cpuacct.usage").read_text()) / 1e9
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(harness: str, concurrent: int, group: Path | None) -> dict[str, float]:
    envs = gym.make_vec("HarnessSWE-v0", num_envs=concurrent, vectorization_mode="vector_entry_point",
                        harness=harness, engine="oracle", progress=False)
    try:
        envs.reset(seed=100)
        envs.step(None)  # warm-up: engine loaded, repos materialized, the CLI in the page cache
        envs.reset(seed=1)
        idle = tree_rss_bytes(os.getpid())
        cpu_before, started = cpu_seconds(group), time.perf_counter()
        with PeakMemory() as memory:
            *_, infos = envs.step(None)
        wall = time.perf_counter() - started
        cpu = cpu_seconds(group) - cpu_before
    finally:
        envs.close()
    outcomes = list(infos["outcome"])
    assert outcomes == ["passed"] * concurrent, outcomes
    return {"concurrent": concurrent, "step_wall_s": round(wall, 2),
            "cpu_s_per_episode": round(cpu / concurrent, 2),
            "peak_mib_per_episode": round((memory.peak - idle) / concurrent / 2**20, 1),
            "idle_mib": round(idle / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--harness", default="pi,opencode,claude-code,hermes")
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--json", default=str(RESULTS))
    args = parser.parse_args()
    method, group = cpu_account()
    results = {"machine": {"cpus": os.cpu_count()}, "engine": "oracle", "cpu_method": method,
               "harnesses": {}}
    try:
        for harness in args.harness.split(","):
            results["harnesses"][harness] = row = measure(harness, args.concurrent, group)
            print(f"{harness:12} {row['cpu_s_per_episode']:6.2f} CPU s/episode, "
                  f"{row['peak_mib_per_episode']:7.1f} MiB/episode peak, "
                  f"step of {args.concurrent} in {row['step_wall_s']:.1f} s")
    finally:
        if group is not None:  # back to the root group, so ours can go
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            try:
                group.rmdir()
            except OSError as exc:  # a process of ours still in it
                print(f"could not remove {group}: {exc}")
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
