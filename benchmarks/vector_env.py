"""One Pi + oracle episode alone vs 8 at once (num_envs=8, group_size=4) on one proxy/engine.

    python benchmarks/vector_env.py [--repeats 2]

Prints both wall times and their ratio: 8 sequential episodes would take 8x the single time;
the vector env overlaps their CLI start-up, tool runs and grading, so the ratio should be well
under 8.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines.oracle import OracleEngine
from harness_gym.engines.tiny import load_tiny_engine


def timed_step(envs, seed: int) -> float:
    envs.reset(seed=seed)
    started = time.perf_counter()
    *_, infos = envs.step(None)
    elapsed = time.perf_counter() - started
    assert all(o == "passed" for o in infos["outcome"]), list(infos["outcome"])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per setting (best kept)")
    args = parser.parse_args()
    tiny = load_tiny_engine()
    times = {}
    try:
        for num_envs, group_size in ((1, 1), (8, 4)):
            envs = gym.make_vec("HarnessSWE-v0", num_envs=num_envs, group_size=group_size,
                                vectorization_mode="vector_entry_point", harness="pi",
                                engine=OracleEngine(tiny), progress=False)
            try:
                timed_step(envs, seed=100)  # warm-up: repos materialized, CLI in page cache
                times[num_envs] = min(timed_step(envs, seed=s) for s in range(args.repeats))
            finally:
                envs.close()
    finally:
        tiny.close()
    ratio = times[8] / times[1]
    print(f"1 episode: {times[1]:.2f} s   8 concurrent episodes: {times[8]:.2f} s   "
          f"ratio: {ratio:.2f}x (sequential would be 8x; "
          f"{8 * times[1] / times[8]:.1f} episodes' worth of throughput per single-episode time)")


if __name__ == "__main__":
    main()
