"""The generated task family: deterministic by seed, 200 training and 50 held-out tasks loadable
by name, held-out names that never occur in training, small one-file repos whose statement
points at the file, and tasks that validate for real (gold passes, unfixed fails F2P, P2P
passes) in a sandbox through the grader."""

from __future__ import annotations

import ast
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from harness_gym.cli import main as cli_main
from harness_gym.sandbox.local import LocalSandboxBackend
from harness_gym.tasks import TaskError, load_tasks, validate_task
from harness_gym.tasks.diffs import paths_touched_by
from harness_gym.tasks.family import (
    HELDOUT_NOUNS,
    KINDS,
    TRAIN_NOUNS,
    SelfCheckError,
    generate_split,
    validate_family,
    write_family,
)
from harness_gym.tasks.family.bugs import Check, Snippet
from harness_gym.tasks.family.cli import main as family_main
from harness_gym.tasks.family.suite import _self_check

from support.task_sandboxes import PYTHON_PATH_ENV

TRAIN = load_tasks("family:train")
HELDOUT = load_tasks("family:heldout")


def changed_lines(patch: str) -> list[str]:
    return [line for line in patch.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def defined_names(source: str) -> set[str]:
    """Every identifier a module defines: functions, their parameters, assigned names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def test_the_family_loads_by_name_with_200_training_and_50_held_out_tasks():
    assert len(TRAIN) == 200 and len(HELDOUT) == 50
    ids = [task.instance_id for task in TRAIN + HELDOUT]
    assert len(set(ids)) == len(ids)
    assert len({task.problem_statement for task in TRAIN + HELDOUT}) == len(ids)
    assert load_tasks("family")[0].instance_id == TRAIN[0].instance_id  # train is the default


def test_an_unknown_split_is_refused_saying_which_exist():
    with pytest.raises(TaskError, match="family:heldout"):
        load_tasks("family:validation")


def test_generation_is_deterministic_by_seed_and_a_small_suite_is_a_prefix_of_a_large_one():
    first, again = generate_split("train", 12, seed=3), generate_split("train", 12, seed=3)
    assert first == again
    assert generate_split("train", 5, seed=3) == first[:5]
    other = generate_split("train", 12, seed=4)
    assert [t.source for t in other] != [t.source for t in first]


def test_every_bug_kind_appears_evenly_in_both_splits():
    for tasks, count in ((TRAIN, 200), (HELDOUT, 50)):
        kinds = Counter(task.extra["family"]["kind"] for task in tasks)
        assert set(kinds) == set(KINDS)
        assert max(kinds.values()) - min(kinds.values()) <= 1, kinds
        assert sum(kinds.values()) == count


@pytest.mark.parametrize("task", TRAIN[:20] + HELDOUT[:10], ids=lambda t: t.instance_id)
def test_a_task_is_one_short_file_that_the_statement_names_with_a_one_line_fix(task):
    family = task.extra["family"]
    files = sorted(p.relative_to(task.repo_dir).as_posix()
                   for p in task.repo_dir.rglob("*") if p.is_file())
    assert files == sorted([family["path"], f"tests/test_{family['path']}", "pyproject.toml"])
    source = (task.repo_dir / family["path"]).read_text()
    assert len(source.splitlines()) <= 40 and len(source) < 1_200
    assert f"`{family['path']}`" in task.problem_statement
    assert f"`{family['function']}" in task.problem_statement
    assert len(task.problem_statement) < 400
    assert paths_touched_by(task.patch) == [family["path"]]
    assert len(changed_lines(task.patch)) == 2  # one line out, one line in
    assert all(p.startswith("tests/") for p in paths_touched_by(task.test_patch))
    assert task.install_config["log_parser"] == "pytest"
    assert task.FAIL_TO_PASS and task.PASS_TO_PASS
    assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)


def test_held_out_names_never_occur_in_training():
    assert not set(HELDOUT_NOUNS) & set(TRAIN_NOUNS)
    training_text = "\n".join(
        path.read_text() for task in TRAIN for path in task.repo_dir.rglob("*.py")
    ) + "\n".join(task.problem_statement + task.patch + task.test_patch for task in TRAIN)
    training_words = set(re.findall(r"\w+", training_text))
    for task in HELDOUT:
        family = task.extra["family"]
        source = (task.repo_dir / family["path"]).read_text()
        names = defined_names(source) | {Path(family["path"]).stem, family["function"]}
        names |= {test.rpartition("::")[2] for test in task.FAIL_TO_PASS + task.PASS_TO_PASS}
        leaked = names & training_words
        assert not leaked, f"{task.instance_id}: {sorted(leaked)} also occur in training"


def test_the_self_check_refuses_a_bug_that_the_tests_cannot_see():
    harmless = Snippet(
        "no_op", "def twice_x(n):\n    return n * 2\n", "    return n * 2", "    return 2 * n",
        "twice_x", ("twice_x",), keeps=(),
        breaks=(Check("test_twice_x", "    assert twice_x(3) == 6"),),
        example="twice_x(3)", rule="It doubles.",
    )
    with pytest.raises(SelfCheckError, match="passes before the fix"):
        _self_check(harmless, harmless.buggy_code, harmless.code, [], "probe")


# One task of every kind, from both splits, validated the slow real way.
SAMPLE = [next(t for t in (TRAIN if i % 2 else HELDOUT) if t.extra["family"]["kind"] == kind)
          for i, kind in enumerate(KINDS)]


@pytest.mark.parametrize("task", SAMPLE, ids=lambda t: t.extra["family"]["kind"])
def test_a_task_of_every_kind_validates_in_a_real_sandbox(task):
    report = validate_task(task, LocalSandboxBackend(), runs=1, env=PYTHON_PATH_ENV,
                           check_unfixed=True, timeout_s=120)
    assert report.ok, report.problems
    assert report.unfixed is not None and report.unfixed.outcome == "failed"
    assert report.runs[0].f2p.passed == len(task.FAIL_TO_PASS)


class CountingBackend(LocalSandboxBackend):
    created = 0

    def create(self, spec):
        CountingBackend.created += 1
        return super().create(spec)


def test_validate_family_caches_verdicts_and_rechecks_only_changed_tasks(tmp_path: Path):
    write_family(tmp_path / "family", seed=7, train=2, heldout=1)
    split = tmp_path / "family" / "train"
    verdicts = validate_family(split, CountingBackend(), env=PYTHON_PATH_ENV)
    assert [v["ok"] for v in verdicts.values()] == [True, True]
    assert CountingBackend.created == 4  # unfixed + gold, per task
    assert (split / "validation.json").is_file()

    CountingBackend.created = 0
    assert validate_family(split, CountingBackend(), env=PYTHON_PATH_ENV) == verdicts
    assert CountingBackend.created == 0

    # A task whose files changed is checked again, and here found broken.
    task_dir = sorted(p for p in split.iterdir() if p.is_dir())[0]
    source = next((task_dir / "repo").glob("*.py"))
    removed, added = changed_lines(load_tasks(task_dir)[0].patch)
    source.write_text(source.read_text().replace(removed[1:], added[1:]))  # the fix, planted
    again = validate_family(split, CountingBackend(), env=PYTHON_PATH_ENV)
    assert CountingBackend.created >= 1
    assert not again[task_dir.name]["ok"]
    assert any("pass without the fix" in p or "does not apply" in p
               for p in again[task_dir.name]["problems"])


def test_the_cli_generates_a_family_that_loads(tmp_path: Path, capsys):
    out = tmp_path / "generated"
    assert cli_main(["tasks", "generate", "--out", str(out), "--seed", "5",
                     "--train", "3", "--heldout", "2"]) == 0
    assert "3 training and 2 held-out" in capsys.readouterr().out
    assert [t.instance_id for t in load_tasks(out / "train")] == [
        f"harness-gym__family-train-{i:04d}" for i in range(3)]
    assert len(load_tasks(out / "heldout")) == 2
    with pytest.raises(FileExistsError):
        write_family(out, seed=5, train=1, heldout=1)
    # The same command without the harness-gym CLI: python -m harness_gym.tasks.family
    assert family_main(["generate", "--out", str(tmp_path / "again"), "--seed", "5",
                        "--train", "3", "--heldout", "2"]) == 0
    assert [t.to_dict() for t in load_tasks(tmp_path / "again" / "train")] == [
        t.to_dict() for t in load_tasks(out / "train")]  # same seed, same tasks, same commits


def test_generating_the_default_family_is_fast():
    started = time.perf_counter()
    generate_split("train", 200, seed=11)
    generate_split("heldout", 50, seed=11)
    assert time.perf_counter() - started < 20  # ~1 s on an idle core; generous for a busy box
