"""The symptom tier of the family: 2-3 module repos where the bug sits in a helper that a front
function calls, a statement that quotes only the front call's wrong result (never a file, the
helper or the fix), the held-out split's names never in training, and tasks that validate for
real in a sandbox (gold passes, unfixed fails FAIL_TO_PASS, PASS_TO_PASS passes)."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

from harness_gym.cli import main as cli_main
from harness_gym.sandbox.local import LocalSandboxBackend
from harness_gym.tasks import TaskError, load_tasks, validate_task
from harness_gym.tasks.diffs import paths_touched_by
from harness_gym.tasks.family import (
    KINDS,
    SelfCheckError,
    generate_symptom_split,
    validate_family,
    write_symptom_family,
)
from harness_gym.tasks.family.bugs import Check
from harness_gym.tasks.family.symptom import _self_check

from support.task_sandboxes import PYTHON_PATH_ENV

TRAIN = load_tasks("family-symptom:train")
HELDOUT = load_tasks("family-symptom:heldout")


def defined_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def test_the_tier_loads_by_name_with_200_training_and_50_held_out_tasks():
    assert len(TRAIN) == 200 and len(HELDOUT) == 50
    ids = [t.instance_id for t in TRAIN + HELDOUT]
    assert len(set(ids)) == len(ids)
    assert len({t.problem_statement for t in TRAIN + HELDOUT}) == len(ids)
    assert load_tasks("family-symptom")[0].instance_id == TRAIN[0].instance_id
    with pytest.raises(TaskError, match="family-symptom:heldout"):
        load_tasks("family-symptom:validation")


def test_generation_is_deterministic_by_seed_and_index():
    first = generate_symptom_split("heldout", 6, seed=2)
    assert first == generate_symptom_split("heldout", 6, seed=2)
    assert generate_symptom_split("heldout", 3, seed=2) == first[:3]
    assert [t.files for t in generate_symptom_split("heldout", 6, seed=3)] != [
        t.files for t in first]


def test_every_bug_kind_appears_evenly():
    for tasks, count in ((TRAIN, 200), (HELDOUT, 50)):
        kinds = Counter(t.extra["family"]["kind"] for t in tasks)
        assert set(kinds) == set(KINDS)
        assert max(kinds.values()) - min(kinds.values()) <= 1, kinds


@pytest.mark.parametrize("task", TRAIN[:20] + HELDOUT[:10], ids=lambda t: t.instance_id)
def test_the_statement_gives_the_symptom_only_and_the_bug_is_one_import_away(task):
    family = task.extra["family"]
    repo = task.repo_dir
    modules = sorted(p.name for p in repo.glob("*.py"))
    assert 2 <= len(modules) <= 3 and family["entry"] in modules and family["path"] in modules
    assert paths_touched_by(task.patch) == [family["path"]] != [family["entry"]]
    statement = task.problem_statement
    assert f"{family['function']}(" in statement  # the front call, quoted
    for secret in (*modules, *(Path(m).stem for m in modules), family["helper"], "line"):
        assert not re.search(rf"\b{re.escape(secret)}\b", statement), (secret, statement)
    # The front function calls the helper, imported from the buggy module.
    entry = (repo / family["entry"]).read_text()
    assert f"from {Path(family['path']).stem} import {family['helper']}" in entry
    assert f"{family['helper']}(" in ast.get_source_segment(entry, next(
        n for n in ast.parse(entry).body
        if isinstance(n, ast.FunctionDef) and n.name == family["function"]))
    # A hidden front-level test fails, and so does one on the helper itself.
    assert any(t.startswith(f"tests/test_{Path(family['entry']).stem}.py::")
               for t in task.FAIL_TO_PASS)
    assert any(t.startswith(f"tests/test_{Path(family['path']).stem}.py::")
               for t in task.FAIL_TO_PASS)
    assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
    removed = [line for line in task.patch.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(removed) == 2  # a one-line fix


def test_held_out_names_never_occur_in_training():
    training_text = "\n".join(
        p.read_text() for t in TRAIN for p in t.repo_dir.rglob("*.py")
    ) + "\n".join(t.problem_statement + t.patch + t.test_patch for t in TRAIN)
    training_words = set(re.findall(r"\w+", training_text))
    for task in HELDOUT:
        names: set[str] = set()
        for path in task.repo_dir.rglob("*.py"):
            names |= defined_names(path.read_text()) | {path.stem}
        names |= {test.rpartition("::")[2] for test in task.FAIL_TO_PASS + task.PASS_TO_PASS}
        leaked = names & training_words
        assert not leaked, f"{task.instance_id}: {sorted(leaked)} also occur in training"


def test_the_self_check_refuses_a_repo_whose_tests_do_not_see_the_bug():
    (task,) = generate_symptom_split("train", 1, seed=9)
    fixed = {**task.files, task.path: task.fixed_source}
    keeps = {p: [] for p in task.tests}
    adds = {p: [] for p in task.tests}
    name = task.fail_to_pass[0].rpartition("::")[2]
    path = task.fail_to_pass[0].partition("::")[0]
    adds[path] = [Check(name, "")]
    with pytest.raises(SelfCheckError, match="passes before the fix"):
        _self_check(fixed, fixed, task.tests_after, keeps, adds, "probe")  # "buggy" = fixed


def test_tasks_validate_in_a_real_sandbox_and_through_validate_family(tmp_path: Path):
    write_symptom_family(tmp_path / "tier", seed=4, train=2, heldout=0)
    verdicts = validate_family(tmp_path / "tier" / "train", LocalSandboxBackend(),
                               env=PYTHON_PATH_ENV)
    assert [v["ok"] for v in verdicts.values()] == [True, True], verdicts
    three = next(t for t in HELDOUT if len(list(t.repo_dir.glob("*.py"))) == 3)
    report = validate_task(three, LocalSandboxBackend(), runs=1, env=PYTHON_PATH_ENV,
                           check_unfixed=True, timeout_s=120)
    assert report.ok, report.problems
    assert report.unfixed is not None and report.unfixed.outcome == "failed"
    assert report.runs[0].f2p.passed == len(three.FAIL_TO_PASS)


def test_the_cli_generates_the_tier(tmp_path: Path, capsys):
    out = tmp_path / "generated"
    assert cli_main(["tasks", "generate", "--tier", "symptom", "--out", str(out),
                     "--seed", "5", "--train", "2", "--heldout", "1"]) == 0
    assert "2 training and 1 held-out" in capsys.readouterr().out
    assert [t.instance_id for t in load_tasks(out / "train")] == [
        f"harness-gym__family-symptom-train-{i:04d}" for i in range(2)]
    assert load_tasks(out / "heldout")[0].extra["family"]["tier"] == "symptom"
