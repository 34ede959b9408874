"""`harness-gym tasks make`: the mining command (added to the `tasks` command's actions)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_make_action(
    actions: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]
) -> None:
    make = actions.add_parser(
        "make", parents=parents,
        help="mine validated tasks from a PyPI package (bug injection) or a git history")
    source = make.add_mutually_exclusive_group(required=True)
    source.add_argument("--pypi", metavar="NAME==VERSION",
                        help="inject bugs into this sdist's functions; keep those its tests see")
    source.add_argument("--git", metavar="PATH", nargs="+", action="extend",
                        help="commits of this repo whose new tests fail before, pass after; "
                        "several repos (or --git again) go into one DIR, taken in turn")
    make.add_argument("--since", metavar="REV", help="with --git: only commits after REV")
    make.add_argument("--n", type=int, required=True, help="tasks to keep")
    make.add_argument("--out", required=True, help="task directory (re-run to resume)")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--sandbox", default=None, help="backend the tasks will run on (default: "
                      "bwrap where it works)")
    make.add_argument("--test-timeout", type=float, default=300.0)
    make.add_argument("--max-patch-lines", type=int, default=120,
                      help="reject a task whose gold patch is longer (default 120 lines)")
    make.add_argument("--quiet", action="store_true", help="no progress bar")
    make.set_defaults(handler=_make)


def _make(args: argparse.Namespace) -> int:
    import sys

    from . import make_tasks
    from .envs import EnvBuildError
    from .image_env import ImageEnvError

    try:
        summary = make_tasks(out=Path(args.out), n=args.n, pypi=args.pypi,
                             git=[Path(p) for p in args.git or []], since=args.since,
                             seed=args.seed, sandbox=args.sandbox, progress=not args.quiet,
                             timeout_s=args.test_timeout,
                             max_patch_lines=args.max_patch_lines)  # fmt: skip
    except (EnvBuildError, ImageEnvError) as error:  # the registry or the image, not a bug
        print(f"harness-gym: error: {error}", file=sys.stderr)
        return 2
    print(summary.describe())
    for task_id, problems in sorted(summary.problems.items()):
        print(f"  rejected {task_id}: {'; '.join(problems)[:300]}")
    return 0 if summary.kept else 1
