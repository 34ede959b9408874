"""Mine tasks from real code and check each through Pi: the oracle passes it, the noop fails it.

    python benchmarks/mining.py [--sandbox bwrap] [--n 20] [--only pypi:toolz==0.12.1]

Sources: bug injection into two registry packages (`--pypi`) and real histories made from
each package's own releases (`release_history`, one commit per release: a list of versions, or
every final release the registry lists in a range, `registry_versions`), mined with `--git`
(`git:A+B`: both histories into one directory, `--git A B`).
Each source is mined by the command itself, `harness-gym tasks make --pypi X==V | --git REPO
--n N --out DIR --sandbox S`, then every kept task runs as an episode
`gym.make("HarnessSWE-v0", tasks=DIR, engine=E, harness="pi")` for E in `oracle` and
`oracle:noop`. Sdists, envs and suite runs are cached (`$HARNESS_GYM_CACHE`), so a second run
only validates and plays the episodes again. Writes benchmarks/results/mining_<sandbox>.json
(or `--results NAME`): per source the mining summary (candidates, kept, rejected by reason,
split, and the split's unit, held-out unit count and held-out tasks, difficulty levels), the
history's releases, the episode outcomes and wall times.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import gymnasium as gym
from harness_gym.tasks import load_tasks
from harness_gym.tasks.mine.make import SUMMARY_FILE
from harness_gym.tasks.mine.split import SPLIT_FILE
from harness_gym.tasks.mine.history import git
from harness_gym.tasks.mine.releases import registry_versions, release_history

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.cli import main as cli_main

RESULTS = Path(__file__).resolve().parent / "results"
SOURCES = {
    "pypi:inflection==0.5.1": None,
    "pypi:toolz==0.12.1": None,
    "git:inflection": ["0.1.2", "0.2.0", "0.2.1", "0.3.0", "0.3.1", "0.4.0", "0.5.0", "0.5.1"],
    # older toolz sdists do not build their metadata on Python 3.11, so pip cannot fetch them
    "git:toolz": ["0.9.0", "0.10.0", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.12.1"],
    # every release in the range (small releases that ship their tests in the sdist)
    "git:cachetools": ("1.0.0", "8.0.2"),
    "git:parse": ("1.6.0", "1.22.4"),
    # both histories above into one directory, one command: `tasks make --git A B`
    "git:cachetools+parse": None,
}


def _episodes(directory: Path, sandbox: str) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Outcome counts per engine, and each episode that did not end as it should."""
    outcomes: dict[str, dict[str, int]] = {}
    unexpected: list[str] = []
    for engine, wanted in (("oracle", "passed"), ("oracle:noop", "failed")):
        counts: Counter[str] = Counter()
        for task in load_tasks(directory):
            env = gym.make("HarnessSWE-v0", tasks=str(directory), engine=engine, harness="pi",
                           sandbox=sandbox, episode_timeout_s=600)  # fmt: skip
            try:
                env.reset(options={"task_id": task.instance_id})
                _, _, _, _, info = env.step({})
                counts[str(info["outcome"])] += 1
                if info["outcome"] != wanted:
                    unexpected.append(f"{engine} {task.instance_id}: {info['outcome']} "
                                      f"{str(info.get('error'))[:200]}")  # fmt: skip
            finally:
                env.close()
        outcomes[engine] = dict(counts)
    return outcomes, unexpected


def _history(name: str, spec: object, dest: Path) -> tuple[Path, dict[str, object]]:
    """`name`'s releases as a git repository, and what it holds."""
    started = time.monotonic()
    if isinstance(spec, tuple):  # a range: every final release the registry lists in it
        versions = registry_versions(name, since=spec[0], until=spec[1])
    else:
        versions = list(spec or [])
    repo = release_history(name, versions, dest, skip_missing=True)
    return repo, {"releases": len(versions), "first": versions[0], "last": versions[-1],
                  "commits": len(git(repo, "rev-list", "HEAD").split()),
                  "history_wall_s": round(time.monotonic() - started, 1)}  # fmt: skip


def _mine(source: str, n: int, sandbox: str, scratch: Path) -> dict[str, object]:
    kind, _, what = source.partition(":")
    out = scratch / source.replace(":", "-").replace("=", "")
    history: dict[str, object] = {}
    source_args = ["--pypi", what]
    if kind == "git":
        names = what.split("+")
        made = [_history(name, SOURCES[f"git:{name}"], scratch / "repos" / name)
                for name in names]  # fmt: skip
        source_args = ["--git", *(str(repo) for repo, _ in made)]
        history = made[0][1] if len(made) == 1 else {"repos": {name: h for name, (_, h) in
                                                               zip(names, made, strict=True)}}
    started = time.monotonic()
    cli_main(["tasks", "make", *source_args, "--n", str(n), "--out", str(out), "--sandbox",
              sandbox])  # fmt: skip
    mined_s = time.monotonic() - started
    summary = json.loads((out / SUMMARY_FILE).read_text())
    split = json.loads((out / SPLIT_FILE).read_text())
    kept = load_tasks(out) if summary["kept"] else []
    levels = Counter(t.extra["mine"]["difficulty"]["level"] for t in kept)
    started = time.monotonic()
    episodes, unexpected = _episodes(out, sandbox) if kept else ({}, [])
    row = {**summary, "source": source}
    return {"summary": {k: v for k, v in row.items() if k != "out"}, **history,
            "split_unit": split["unit"], "heldout_units": len(split["heldout_units"]),
            "heldout_tasks": split["heldout"], "difficulty": dict(levels),
            "episodes_pi": episodes, "unexpected": unexpected, "mine_wall_s": round(mined_s, 1),
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
