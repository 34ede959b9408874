"""Generating the family: many one-file repositories, each with one planted bug.

`generate_split("train", 200, seed=0)` draws tasks; `write_family(out, seed, train, heldout)`
writes them as task directories (`out/train/<id>/{task.json, repo/}`, same for `heldout`), the
layout `load_tasks` reads. Generation is a pure function of (seed, split, index): task `i` is the
same whatever the requested count, so a small suite is a prefix of a large one.

Every task is checked in-process as it is drawn (fast: no sandbox): its tests are executed
against the buggy and the fixed source, and the draw is repeated until FAIL_TO_PASS fails before
the fix, everything passes after it and PASS_TO_PASS passes before it. `validate_family` repeats
that check the slow, real way (`validate_task` in a sandbox, pytest and the grader) and caches
its verdicts in `validation.json` next to the suite.
"""

from __future__ import annotations

import difflib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bugs import KINDS, Check, Snippet
from .names import SPLITS, nouns_for

__all__ = [
    "FAMILY_VERSION",
    "FamilyTask",
    "SelfCheckError",
    "generate_split",
    "write_family",
]

FAMILY_VERSION = "v1"  # bump whenever a kind, a name pool or the layout changes
TEST_CMD = "python -m pytest -rA -p no:cacheprovider tests"
PYPROJECT = '[tool.pytest.ini_options]\ntestpaths = ["tests"]\npythonpath = ["."]\n'
FILE_SUFFIXES = ("rules", "prices", "labels", "tools", "calc", "helpers", "logic", "util")
MAX_DRAWS = 50


class SelfCheckError(RuntimeError):
    """A drawn task's tests did not behave as its bug says (a broken kind, not bad luck)."""


@dataclass(frozen=True)
class FamilyTask:
    instance_id: str
    split: str
    kind: str
    path: str  # the one source file, relative to the repo root
    function: str  # the function the statement is about
    problem_statement: str
    source: str  # the file with the bug
    fixed_source: str
    tests_path: str
    tests: str  # the test file the agent sees (PASS_TO_PASS tests)
    tests_after: str  # with the FAIL_TO_PASS tests the test patch adds
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """`task.json`: SWE-rebench V2 fields, plus `family` (what was planted, where)."""
        return {
            "instance_id": self.instance_id,
            "repo": f"harness-gym/family-{self.path.removesuffix('.py').replace('_', '-')}",
            "problem_statement": self.problem_statement,
            "patch": unified_diff(self.path, self.source, self.fixed_source),
            "test_patch": unified_diff(self.tests_path, self.tests, self.tests_after),
            "FAIL_TO_PASS": self.fail_to_pass,
            "PASS_TO_PASS": self.pass_to_pass,
            "install_config": {"test_cmd": TEST_CMD, "log_parser": "pytest"},
            "family": {"version": FAMILY_VERSION, "split": self.split, "kind": self.kind,
                       "path": self.path, "function": self.function},
        }

    def write(self, folder: Path) -> None:
        repo = folder / "repo"
        (repo / "tests").mkdir(parents=True)
        (repo / self.path).write_text(self.source)
        (repo / self.tests_path).write_text(self.tests)
        (repo / "pyproject.toml").write_text(PYPROJECT)
        (folder / "task.json").write_text(json.dumps(self.row(), indent=2) + "\n")


def generate_split(split: str, count: int, *, seed: int = 0) -> list[FamilyTask]:
    """`count` tasks of `split` ("train" or "heldout"), balanced over the bug kinds."""
    return draw_split("family", split, count, seed, _draw)


def draw_split(family: str, split: str, count: int, seed: int,
               draw: Callable[[random.Random, str, int, str, list[str]], Any]) -> list[Any]:
    """`count` tasks from `draw(rng, split, index, kind, nouns)`, balanced over the bug kinds,
    each statement unique; task `i` depends only on (family, seed, split, i)."""
    nouns = nouns_for(split)
    kinds = list(KINDS)
    random.Random(f"{family}:{seed}:{split}:kinds").shuffle(kinds)
    tasks: list[Any] = []
    statements: set[str] = set()
    for index in range(count):
        rng = random.Random(f"{family}:{seed}:{split}:{index}")
        for _ in range(MAX_DRAWS):
            task = draw(rng, split, index, kinds[index % len(kinds)], nouns)
            if task.problem_statement not in statements:
                break
        else:
            raise SelfCheckError(f"{split} task {index}: no unique statement in {MAX_DRAWS} draws")
        statements.add(task.problem_statement)
        tasks.append(task)
    return tasks


def write_family(out: Path, *, seed: int = 0, train: int = 200, heldout: int = 50) -> Path:
    """Write both splits under `out` (`out/train`, `out/heldout`) and a `family.json` that says
    how they were made. `out` must be absent or empty."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: generate into a new directory")
    counts = {"train": train, "heldout": heldout}
    for split in SPLITS:
        (out / split).mkdir(parents=True)
        for task in generate_split(split, counts[split], seed=seed):
            task.write(out / split / task.instance_id)
    manifest = {"family": FAMILY_VERSION, "seed": seed, **counts}
    (out / "family.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def unified_diff(path: str, before: str, after: str) -> str:
    """A `git apply`-able diff of one file."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"a/{path}", tofile=f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


# --- drawing one task ---------------------------------------------------------------------------


def _draw(
    rng: random.Random, split: str, index: int, kind: str, nouns: Sequence[str]
) -> FamilyTask:
    noun, *others = rng.sample(nouns, 3)
    bug = KINDS[kind](rng, noun)
    distractors = [KINDS[k](rng, n) for k, n in zip(_other_kinds(rng, kind), others, strict=True)]
    distractors = distractors[: rng.choice([1, 2])]
    blocks = [bug, *distractors]
    rng.shuffle(blocks)
    stem = f"{noun}_{rng.choice(FILE_SUFFIXES)}"
    header = f'"""{noun.capitalize()} helpers."""\n\n\n'
    fixed = header + "\n\n".join(b.code for b in blocks)
    source = header + "\n\n".join(b.buggy_code if b is bug else b.code for b in blocks)

    exports = sorted({name for b in blocks for name in b.exports})
    keeps = [check for b in blocks for check in (b.keeps if b is bug else b.keeps + b.breaks)]
    tests = f"from {stem} import {', '.join(exports)}\n\n\n" + "\n\n".join(
        c.source() for c in keeps
    )
    tests_after = tests + "".join("\n\n" + c.source() for c in bug.breaks)

    expected, actual = _self_check(bug, source, fixed, keeps, f"{split} task {index}")
    path, tests_path = f"{stem}.py", f"tests/test_{stem}.py"
    statement = (
        f"`{bug.function}` in `{path}` returns the wrong value\n\n"
        f"`{bug.example}` {_outcome(actual)}, but it should return `{expected!r}`. "
        f"{bug.rule}\n"
    )
    return FamilyTask(
        instance_id=f"harness-gym__family-{split}-{index:04d}",
        split=split, kind=kind, path=path, function=bug.function,
        problem_statement=statement, source=source, fixed_source=fixed,
        tests_path=tests_path, tests=tests, tests_after=tests_after,
        fail_to_pass=[f"{tests_path}::{c.name}" for c in bug.breaks],
        pass_to_pass=[f"{tests_path}::{c.name}" for c in keeps],
    )


def _other_kinds(rng: random.Random, kind: str) -> list[str]:
    # Distractors of other kinds, so the file never holds two functions of the bug's shape.
    return rng.sample([k for k in KINDS if k != kind], 2)


def _self_check(
    bug: Snippet, source: str, fixed: str, keeps: list[Check], label: str
) -> tuple[Any, Any]:
    """Run the checks in-process; return the example's (expected, actual) values."""
    for version, text in (("buggy", source), ("fixed", fixed)):
        for check in keeps:
            if not _passes(text, check):
                raise SelfCheckError(
                    f"{label}: PASS_TO_PASS {check.name} fails on the {version} file"
                )
    for check in bug.breaks:
        if _passes(source, check):
            raise SelfCheckError(f"{label}: FAIL_TO_PASS {check.name} passes before the fix")
        if not _passes(fixed, check):
            raise SelfCheckError(f"{label}: FAIL_TO_PASS {check.name} fails after the fix")
    expected, actual = _evaluate(fixed, bug.example), _evaluate(source, bug.example)
    if expected == actual:
        raise SelfCheckError(f"{label}: {bug.example} gives {actual!r} with and without the bug")
    return expected, actual


def _namespace(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<family>", "exec"), namespace)  # our own generated code
    return namespace


def _passes(source: str, check: Check) -> bool:
    namespace = _namespace(source)
    exec(compile(check.source(), "<check>", "exec"), namespace)
    test: Callable[[], None] = namespace[check.name]
    try:
        test()
    except Exception:  # an AssertionError, or the bug raising (an IndexError, a TypeError)
        return False
    return True


@dataclass(frozen=True)
class _Raised:
    error: str


def _evaluate(source: str, expression: str) -> Any:
    try:
        return eval(expression, _namespace(source))  # our own generated call
    except Exception as error:
        return _Raised(type(error).__name__)


def _outcome(value: Any) -> str:
    return f"raises `{value.error}`" if isinstance(value, _Raised) else f"returns `{value!r}`"
