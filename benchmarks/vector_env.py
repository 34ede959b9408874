"""The vector env's throughput, and what running its episodes on Ray costs over local threads.

    python benchmarks/vector_env.py [--repeats 2] [--ray]

1. One Pi + oracle episode alone vs 8 at once (num_envs=8, group_size=4) on one proxy/engine:
   8 sequential episodes would take 8x the single time; the vector env overlaps their CLI
   start-up, tool runs and grading, so the ratio should be well under 8.
2. With `--ray`, instead: the same 8-episode step on the Ray executor (a local one-node
   cluster: one `NodeRunner` actor with its own proxy and engine) vs on threads, and the Ray hop
   itself: the round trip of an episode that ends at once on the runner (an unknown harness:
   `infra_error` without a sandbox or CLI), so what is measured is submit -> executor thread ->
   actor call -> result pickled back -> future, nothing of the episode.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines.oracle import OracleEngine
from harness_gym.engines.tiny import load_tiny_engine
from harness_gym.episode import EpisodeRequest
from harness_gym.scaleout.ray_cluster import RayCluster
from harness_gym.tasks.loader import load_tasks

LOCAL_RAY = RayCluster(init_kwargs={"num_cpus": 2}, poll_s=1.0)


def timed_step(envs, seed: int) -> float:
    envs.reset(seed=seed)
    started = time.perf_counter()
    *_, infos = envs.step(None)
    elapsed = time.perf_counter() - started
    assert all(o == "passed" for o in infos["outcome"]), list(infos["outcome"])
    return elapsed


def best_step(repeats: int, **make) -> tuple[float, object]:
    """Best step time over `repeats` (after a warm-up step), and the executor's hop (p50, s)."""
    envs = gym.make_vec("HarnessSWE-v0", vectorization_mode="vector_entry_point", harness="pi",
                        progress=False, **make)
    try:
        timed_step(envs, seed=100)  # warm-up: repos materialized, CLI in page cache
        best = min(timed_step(envs, seed=s) for s in range(repeats))
        return best, hop_p50(envs.unwrapped.executor)
    finally:
        envs.close()


def hop_p50(executor, n: int = 50) -> float:
    request = EpisodeRequest("no-such-harness", load_tasks("builtin")[0])
    times = []
    for _ in range(n):
        started = time.perf_counter()
        result = executor.submit(request).result()
        times.append(time.perf_counter() - started)
        assert result.outcome == "infra_error"
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed steps per setting (best kept)")
    parser.add_argument("--ray", action="store_true", help="the step on Ray vs on threads")
    args = parser.parse_args()
    if args.ray:
        ray_vs_threads(args.repeats)
    else:
        vector_vs_single(args.repeats)


def vector_vs_single(repeats: int) -> None:
    tiny = load_tiny_engine()
    times = {}
    try:
        for num_envs, group_size in ((1, 1), (8, 4)):
            times[num_envs], _ = best_step(repeats, num_envs=num_envs,
                                           group_size=group_size, engine=OracleEngine(tiny))
    finally:
        tiny.close()
    ratio = times[8] / times[1]
    print(f"1 episode: {times[1]:.2f} s   8 concurrent episodes: {times[8]:.2f} s   "
          f"ratio: {ratio:.2f}x (sequential would be 8x; "
          f"{8 * times[1] / times[8]:.1f} episodes' worth of throughput per single-episode time)")


def ray_vs_threads(repeats: int) -> None:
    same = {"num_envs": 8, "group_size": 4, "engine": "oracle"}  # a spec: Ray ships it
    threads, thread_hop = best_step(repeats, **same)
    on_ray, ray_hop = best_step(repeats, executor=LOCAL_RAY, **same)
    print(f"8 episodes, threads: {threads:.2f} s   Ray (one local node): {on_ray:.2f} s   "
          f"ratio: {on_ray / threads:.2f}x   "
          f"difference: {(on_ray - threads) / 8 * 1000:+.0f} ms per episode")
    print(f"hop of an episode that ends at once, p50: threads {thread_hop * 1000:.2f} ms   "
          f"Ray {ray_hop * 1000:.2f} ms   ratio: {ray_hop / thread_hop:.0f}x")


if __name__ == "__main__":
    main()
