"""The symptom tier: the bug hides in a helper, and the statement only says what goes wrong.

`generate_symptom_split("train", 200, seed=0)` draws tasks of 2-3 small modules: a front module
(`<topic>_report.py`, ...) whose functions wrap helpers imported from `<topic>_<suffix>.py` (and
sometimes a third module), one of those helpers planted with a one-line bug of the family's
kinds. The problem statement quotes one front call and its wrong result (a wrong value, an
exception, or a failing assertion) and never names a file, a line, a helper or the fix: the
agent has to follow the import to the helper, read it (and the tests), and may run them.

Same guarantees as the one-file family (`suite`): a pure function of (seed, split, index); the
held-out split draws from the held-out nouns only (`names`); every task is self-checked
in-process as it is drawn (its modules really imported from one another): FAIL_TO_PASS fails
before the fix and passes after it, PASS_TO_PASS passes on both. `validate_family` validates
the written split in a sandbox as it does the family.
"""

from __future__ import annotations

import ast
import json
import random
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bugs import KINDS, Check, Snippet, _assert
from .names import SPLITS
from .suite import (
    FILE_SUFFIXES,
    PYPROJECT,
    TEST_CMD,
    SelfCheckError,
    _other_kinds,
    draw_split,
    _Raised,
    unified_diff,
)

__all__ = ["SYMPTOM_VERSION", "SymptomTask", "generate_symptom_split", "write_symptom_family"]

SYMPTOM_VERSION = "s1"  # bump whenever the layout, the wrappers or the statements change
FRONT_SUFFIXES = ("report", "summary", "views", "display")
WRAPPER_VERBS = ("report", "describe", "show", "summarize")
LABEL_WORDS = ("total", "result", "value", "entry")


@dataclass(frozen=True)
class SymptomTask:
    instance_id: str
    split: str
    kind: str
    entry: str  # the front module the statement's call lives in
    path: str  # the helper module holding the bug (the only file the fix changes)
    function: str  # the front function the statement calls
    helper: str  # the helper function with the bug
    problem_statement: str
    files: dict[str, str]  # every source file of the repo, buggy
    fixed_source: str  # `files[path]` fixed
    tests: dict[str, str]  # test files the agent sees
    tests_after: dict[str, str]  # with the FAIL_TO_PASS tests the test patch adds
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "repo": f"harness-gym/family-symptom-{Path(self.entry).stem.replace('_', '-')}",
            "problem_statement": self.problem_statement,
            "patch": unified_diff(self.path, self.files[self.path], self.fixed_source),
            "test_patch": "".join(
                unified_diff(p, self.tests[p], self.tests_after[p])
                for p in sorted(self.tests) if self.tests[p] != self.tests_after[p]),
            "FAIL_TO_PASS": self.fail_to_pass,
            "PASS_TO_PASS": self.pass_to_pass,
            "install_config": {"test_cmd": TEST_CMD, "log_parser": "pytest"},
            "family": {"version": SYMPTOM_VERSION, "tier": "symptom", "split": self.split,
                       "kind": self.kind, "path": self.path, "entry": self.entry,
                       "function": self.function, "helper": self.helper},
        }

    def write(self, folder: Path) -> None:
        repo = folder / "repo"
        (repo / "tests").mkdir(parents=True)
        for path, text in {**self.files, **self.tests}.items():
            (repo / path).write_text(text)
        (repo / "pyproject.toml").write_text(PYPROJECT)
        (folder / "task.json").write_text(json.dumps(self.row(), indent=2) + "\n")


def generate_symptom_split(split: str, count: int, *, seed: int = 0) -> list[SymptomTask]:
    """`count` symptom tasks of `split`, balanced over the bug kinds; task `i` is the same
    whatever `count` is."""
    return draw_split("family-symptom", split, count, seed, _draw)


def write_symptom_family(out: Path, *, seed: int = 0, train: int = 200,
                         heldout: int = 50) -> Path:
    """Both splits under `out` (`out/train`, `out/heldout`) and a `family.json`; `out` must be
    absent or empty."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: generate into a new directory")
    counts = {"train": train, "heldout": heldout}
    for split in SPLITS:
        (out / split).mkdir(parents=True)
        for task in generate_symptom_split(split, counts[split], seed=seed):
            task.write(out / split / task.instance_id)
    manifest = {"family": SYMPTOM_VERSION, "tier": "symptom", "seed": seed, **counts}
    (out / "family.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


# --- drawing one task ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Wrapper:
    """A front function around one helper snippet: its code, and a call of it."""

    name: str
    code: str
    call: str
    snippet: Snippet


def _draw(
    rng: random.Random, split: str, index: int, kind: str, nouns: Sequence[str]
) -> SymptomTask:
    topic, noun, *others = rng.sample(nouns, 4)
    bug = KINDS[kind](rng, noun)
    near, far = (KINDS[k](rng, n) for k, n in zip(_other_kinds(rng, kind), others, strict=True))
    nouns_of = {id(bug): noun, id(near): others[0], id(far): others[1]}
    helper_stem, other_stem = (f"{topic}_{s}" for s in rng.sample(FILE_SUFFIXES, 2))
    front_stem = f"{topic}_{rng.choice(FRONT_SUFFIXES)}"
    three = rng.random() < 0.5  # a third module holds the far distractor
    modules: dict[str, list[Snippet]] = {helper_stem: [bug, near] if three else [bug, near, far]}
    if three:
        modules[other_stem] = [far]
    for blocks in modules.values():
        rng.shuffle(blocks)
    home = {id(s): stem for stem, blocks in modules.items() for s in blocks}
    wrapped = [_wrapper(rng, s, nouns_of[id(s)]) for s in (bug, rng.choice([near, far]))]
    rng.shuffle(wrapped)

    fixed = {f"{stem}.py": _module(stem, blocks) for stem, blocks in modules.items()}
    buggy = {**fixed, f"{helper_stem}.py": _module(helper_stem, modules[helper_stem], bug)}
    imports = "".join(sorted({f"from {home[id(w.snippet)]} import {w.snippet.function}\n"
                              for w in wrapped}))
    front = (f'"""What the {topic} screens show."""\n\n{imports}\n\n'
             + "\n\n".join(w.code for w in wrapped))
    fixed[f"{front_stem}.py"] = buggy[f"{front_stem}.py"] = front
    label = f"{split} task {index}"
    (target,) = [w for w in wrapped if w.snippet is bug]
    expected, actual = _evaluate(fixed, target.call), _evaluate(buggy, target.call)
    if isinstance(expected, _Raised) or expected == actual:
        raise SelfCheckError(f"{label}: {target.call} gives {actual!r} with and without the bug")

    keeps: dict[str, list[Check]] = {f"tests/test_{stem}.py": [] for stem in [front_stem, *modules]}
    adds: dict[str, list[Check]] = {path: [] for path in keeps}
    for w in wrapped:
        value = _evaluate(fixed, w.call)
        check = Check(f"test_{w.name}", _assert(w.call, value))
        (adds if w is target else keeps)[f"tests/test_{front_stem}.py"].append(check)
    for stem, blocks in modules.items():
        for snippet in blocks:
            keeps[f"tests/test_{stem}.py"] += snippet.keeps
            if snippet is bug:
                adds[f"tests/test_{stem}.py"] += snippet.breaks
            else:
                keeps[f"tests/test_{stem}.py"] += snippet.breaks
    imported = {f"tests/test_{front_stem}.py": (front_stem, [w.name for w in wrapped])}
    for stem, blocks in modules.items():
        imported[f"tests/test_{stem}.py"] = (stem, [n for s in blocks for n in s.exports])
    tests = {p: _test_file(*imported[p], keeps[p]) for p in keeps}
    tests_after = {p: tests[p] + "".join("\n\n" + c.source() for c in adds[p]) for p in keeps}

    _self_check(buggy, fixed, tests_after, keeps, adds, label)
    f2p = [f"{p}::{c.name}" for p, checks in adds.items() for c in checks]
    p2p = [f"{p}::{c.name}" for p, checks in keeps.items() for c in checks]
    return SymptomTask(
        instance_id=f"harness-gym__family-symptom-{split}-{index:04d}",
        split=split, kind=kind, entry=f"{front_stem}.py", path=f"{helper_stem}.py",
        function=target.name, helper=bug.function,
        problem_statement=_statement(rng, target, expected, actual),
        files=buggy, fixed_source=fixed[f"{helper_stem}.py"],
        tests=tests, tests_after=tests_after, fail_to_pass=f2p, pass_to_pass=p2p,
    )


def _module(stem: str, blocks: list[Snippet], bug: Snippet | None = None) -> str:
    header = f'"""{stem.replace("_", " ").capitalize()}."""\n\n\n'
    return header + "\n\n".join(b.buggy_code if b is bug else b.code for b in blocks)


def _wrapper(rng: random.Random, snippet: Snippet, noun: str) -> _Wrapper:
    """A front function taking the helper's required parameters and formatting its value."""
    params = _required_parameters(snippet)
    name = f"{rng.choice(WRAPPER_VERBS)}_{noun}"
    key = f"{noun}_{rng.choice(LABEL_WORDS)}"
    shape = rng.choice(["text", "pair", "mapping"])
    value = f"{snippet.function}({', '.join(params)})"
    body = {"text": f'    return f"{key} = {{{value}}}"',
            "pair": f'    return ("{key}", {value})',
            "mapping": f'    return {{"{key}": {value}}}'}[shape]
    code = (f"def {name}({', '.join(params)}):\n"
            f'    """The {key.replace("_", " ")} line of the screen."""\n{body}\n')
    arguments = snippet.example[len(snippet.function) + 1 : -1]
    return _Wrapper(name, code, f"{name}({arguments})", snippet)


def _required_parameters(snippet: Snippet) -> list[str]:
    tree = ast.parse(snippet.code)
    (function,) = [n for n in tree.body
                   if isinstance(n, ast.FunctionDef) and n.name == snippet.function]
    arguments = function.args.args
    return [a.arg for a in arguments[: len(arguments) - len(function.args.defaults)]]


def _test_file(module: str, names: list[str], checks: list[Check]) -> str:
    return f"from {module} import {', '.join(sorted(names))}\n\n\n" + "\n\n".join(
        c.source() for c in checks)


def _statement(rng: random.Random, target: _Wrapper, expected: Any, actual: Any) -> str:
    """The symptom only: the front call, what it does, what it should do."""
    call, want = f"`{target.call}`", f"`{expected!r}`"
    if isinstance(actual, _Raised):
        title = f"`{target.name}` fails with {actual.error}"
        body = f"{call} raises `{actual.error}`; it should return {want}."
    else:
        title, body = rng.choice([
            (f"`{target.name}` shows the wrong result",
             f"{call} returns `{actual!r}`, but {want} is expected."),
            (f"Wrong output from `{target.name}`",
             f"Calling {call} gives `{actual!r}` instead of {want}."),
            (f"A check of `{target.name}` fails",
             f"This assertion fails:\n\n    assert {target.call} == {expected!r}\n\n"
             f"The call returns `{actual!r}`."),
        ])
    closing = rng.choice(["Please find the cause and fix it.",
                          "Find out why and fix it; the other results are right.",
                          "Fix the cause, not the symptom."])
    return f"{title}\n\n{body} {closing}\n"


# --- the in-process self-check ------------------------------------------------------------------


@contextmanager
def _imported(files: dict[str, str]) -> Iterator[None]:
    """The repo's modules executed and registered in `sys.modules` (so their `from x import y`
    lines resolve against each other, as pytest's would), removed again afterwards."""
    names = [Path(p).stem for p in files]
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for path in files:  # in insertion order: the helpers, then the front module
            module = types.ModuleType(Path(path).stem)
            sys.modules[module.__name__] = module
            exec(compile(files[path], path, "exec"), module.__dict__)  # our own generated code
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _evaluate(files: dict[str, str], expression: str) -> Any:
    front = list(files)[-1]
    with _imported(files):
        namespace: dict[str, Any] = {}
        exec(compile(files[front], front, "exec"), namespace)
        try:
            return eval(expression, namespace)  # our own generated call
        except Exception as error:
            return _Raised(type(error).__name__)


def _passes(files: dict[str, str], test_file: str) -> dict[str, bool]:
    """Each test function of `test_file` run against `files`: name -> passed."""
    with _imported(files):
        namespace: dict[str, Any] = {}
        exec(compile(test_file, "<tests>", "exec"), namespace)
        results = {}
        for name, test in namespace.items():
            if name.startswith("test_") and callable(test):
                try:
                    test()
                    results[name] = True
                except Exception:  # an AssertionError, or the bug raising
                    results[name] = False
        return results


def _self_check(buggy: dict[str, str], fixed: dict[str, str], tests_after: dict[str, str],
                keeps: dict[str, list[Check]], adds: dict[str, list[Check]], label: str) -> None:
    """Run the written test files (imports and all) against the buggy and the fixed repo."""
    for path, text in tests_after.items():
        for version, files in (("buggy", buggy), ("fixed", fixed)):
            results = _passes(files, text)
            for check in keeps[path]:
                if not results[check.name]:
                    raise SelfCheckError(
                        f"{label}: PASS_TO_PASS {check.name} fails on the {version} repo")
            for check in adds[path]:
                if results[check.name] != (version == "fixed"):
                    where = "passes before" if version == "buggy" else "fails after"
                    raise SelfCheckError(f"{label}: FAIL_TO_PASS {check.name} {where} the fix")
