"""`harness-gym tasks generate|validate` (also `python -m harness_gym.tasks.family ...`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_tasks_command(
    commands: argparse._SubParsersAction, parents: list[argparse.ArgumentParser] = ()
) -> None:
    """Add the `tasks` command (with `generate` and `validate`) to a parser's subcommands;
    `parents` hold the options every command takes (`--debug`)."""
    tasks = commands.add_parser("tasks", parents=list(parents),
                                help="generate and validate the task family, mine tasks")
    _add_actions(tasks, list(parents))


def _add_actions(parser: argparse.ArgumentParser, parents: list[argparse.ArgumentParser]) -> None:
    actions = parser.add_subparsers(dest="tasks_command", required=True)

    generate = actions.add_parser(
        "generate", parents=parents, help="write the family's train and held-out splits as task directories")
    generate.add_argument("--out", required=True, help="new directory for OUT/train, OUT/heldout")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--train", type=int, default=200, help="training tasks")
    generate.add_argument("--heldout", type=int, default=50, help="held-out tasks")
    generate.add_argument("--tier", choices=("one-file", "symptom"), default="one-file",
                          help="one-file: the statement names the fix; symptom: a helper's bug, "
                               "only its symptom stated")
    generate.add_argument("--validate", action="store_true",
                          help="then validate every task in a sandbox (slow: 4-15 s a task)")
    generate.add_argument("--sandbox", default="local", help="sandbox for --validate")
    generate.set_defaults(handler=_generate)

    validate = actions.add_parser(
        "validate", parents=parents, help="gold patch passes, unfixed repo fails F2P, P2P passes (cached)")
    validate.add_argument("directory", help="a split directory (OUT/train) or the family (OUT)")
    validate.add_argument("--sandbox", default="local")
    validate.add_argument("--runs", type=int, default=1, help="gold-patch runs per task")
    validate.set_defaults(handler=_validate)

    from ..mine.cli import add_make_action

    add_make_action(actions, parents)


def _generate(args: argparse.Namespace) -> int:
    from .suite import write_family
    from .symptom import write_symptom_family

    write = write_symptom_family if args.tier == "symptom" else write_family
    out = write(Path(args.out), seed=args.seed, train=args.train, heldout=args.heldout)
    print(f"wrote {args.train} training and {args.heldout} held-out tasks to {out.resolve()}")
    if args.validate:
        args.directory, args.runs = str(out), 1
        return _validate(args)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .names import SPLITS
    from .store import validate_family

    root = Path(args.directory)
    splits = [root / s for s in SPLITS if (root / s).is_dir()] or [root]
    failed = 0
    for directory in splits:
        with tqdm(desc=f"validating {directory.name}", unit="task") as bar:
            verdicts = validate_family(directory, args.sandbox, runs=args.runs,
                                       progress=lambda _, bar=bar: bar.update())
        bad = {task_id: v["problems"] for task_id, v in verdicts.items() if not v["ok"]}
        failed += len(bad)
        for task_id, problems in sorted(bad.items()):
            print(f"  {task_id}: {'; '.join(problems)}")
        print(f"{directory}: {len(verdicts) - len(bad)}/{len(verdicts)} tasks valid")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness_gym.tasks.family")
    _add_actions(parser, [])
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return args.handler(args)
