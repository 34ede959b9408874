"""Mine tasks from real code and check each through Pi: the oracle passes it, the noop fails it.

    python benchmarks/mining.py [--sandbox bwrap] [--n 20] [--only pypi:toolz==0.12.1]

Sources: bug injection into two registry packages (`--pypi`) and two real histories, made from
each package's own releases (`release_history`, one commit per release) and mined with
`--git`. Each source is mined with `make_tasks(n=N)` into a scratch directory, then every kept
task runs as an episode `gym.make("HarnessSWE-v0", tasks=DIR, engine=E, harness="pi")` for E in
`oracle` and `oracle:noop`. Sdists, envs and suite runs are cached (`$HARNESS_GYM_CACHE`), so a
second run only validates and plays the episodes again. Writes
benchmarks/results/mining_<sandbox>.json (or `--results NAME`): per source the mining summary (candidates, kept,
rejected by reason, split, difficulty levels) and the episode outcomes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import gymnasium as gym
from harness_gym.tasks import load_tasks
from harness_gym.tasks.mine import make_tasks
from harness_gym.tasks.mine.releases import release_history

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

RESULTS = Path(__file__).resolve().parent / "results"
SOURCES = {
    "pypi:inflection==0.5.1": None,
    "pypi:toolz==0.12.1": None,
    "git:inflection": ["0.1.2", "0.2.0", "0.2.1", "0.3.0", "0.3.1", "0.4.0", "0.5.0", "0.5.1"],
    # older toolz sdists do not build their metadata on Python 3.11, so pip cannot fetch them
    "git:toolz": ["0.9.0", "0.10.0", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.12.1"],
}


def _episodes(directory: Path, sandbox: str) -> dict[str, dict[str, int]]:
    outcomes: dict[str, dict[str, int]] = {}
    for engine in ("oracle", "oracle:noop"):
        counts: Counter[str] = Counter()
        for task in load_tasks(directory):
            env = gym.make("HarnessSWE-v0", tasks=str(directory), engine=engine, harness="pi",
                           sandbox=sandbox, episode_timeout_s=600)  # fmt: skip
            try:
                env.reset(options={"task_id": task.instance_id})
                _, _, _, _, info = env.step({})
                counts[str(info["outcome"])] += 1
            finally:
                env.close()
        outcomes[engine] = dict(counts)
    return outcomes


def _mine(source: str, n: int, sandbox: str, scratch: Path) -> dict[str, object]:
    kind, _, what = source.partition(":")
    out = scratch / source.replace(":", "-").replace("=", "")
    started = time.monotonic()
    if kind == "pypi":
        summary = make_tasks(pypi=what, n=n, out=out, sandbox=sandbox)
    else:
        repo = release_history(what, SOURCES[source] or [], scratch / "repos" / what)
        summary = make_tasks(git=repo, n=n, out=out, sandbox=sandbox)
    mined_s = time.monotonic() - started
    kept = load_tasks(out) if summary.kept else []
    levels = Counter(t.extra["mine"]["difficulty"]["level"] for t in kept)
    started = time.monotonic()
    episodes = _episodes(out, sandbox) if kept else {}
    row = {**asdict(summary), "source": source}
    return {"summary": {k: v for k, v in row.items() if k != "out"},
            "difficulty": dict(levels), "episodes_pi": episodes,
            "mine_wall_s": round(mined_s, 1),
            "episodes_wall_s": round(time.monotonic() - started, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--only", action="append", choices=sorted(SOURCES))
    parser.add_argument("--results", help="results file name (default mining_<sandbox>.json)")
    args = parser.parse_args()
    results_file = RESULTS / (args.results or f"mining_{args.sandbox}.json")
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    results.update(n=args.n, sandbox=args.sandbox, machine={"note": "2 shared cores, loaded"})
    results.setdefault("sources", {})
    with tempfile.TemporaryDirectory(prefix="harness-gym-mining-bench-") as scratch:
        for source in args.only or list(SOURCES):
            print(f"== {source}", flush=True)
            results["sources"][source] = _mine(source, args.n, args.sandbox, Path(scratch))
            print(json.dumps(results["sources"][source]), flush=True)
            results_file.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
