"""The task suites: the built-in tasks are real (checked through the grader in a sandbox),
directory tasks materialize to the same commit everywhere, and bad task data is refused with a
message that says what to fix."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from harness_gym.tasks import (
    BUILTIN_SUITE_DIR,
    Task,
    TaskError,
    TestStatus,
    apply_patch,
    grade,
    load_tasks,
    materialize,
)
from harness_gym.tasks.diffs import paths_touched_by

from support.task_sandboxes import task_sandbox

BUILTIN = load_tasks("builtin")
TEST_CMD = "python -m pytest -rA -p no:cacheprovider tests"


def _row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "instance_id": "acme__widgets-1",
        "repo": "acme/widgets",
        "base_commit": "0" * 40,
        "problem_statement": "widgets break",
        "patch": "",
        "test_patch": "",
        "FAIL_TO_PASS": ["tests/test_w.py::test_new"],
        "PASS_TO_PASS": [],
        "install_config": {"test_cmd": "pytest -rA", "log_parser": "pytest"},
    }
    row.update(overrides)
    return row


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


# --- the built-in suite -------------------------------------------------------------------------


def test_the_builtin_suite_has_at_least_twelve_distinct_tasks():
    assert len(BUILTIN) >= 12
    assert len({task.instance_id for task in BUILTIN}) == len(BUILTIN)
    assert len({task.repo for task in BUILTIN}) == len(BUILTIN)


@pytest.mark.parametrize("task", BUILTIN, ids=lambda task: task.instance_id)
def test_a_builtin_task_is_small_pytest_only_and_split_into_source_and_test_patches(task: Task):
    assert task.install_config == {"test_cmd": TEST_CMD, "log_parser": "pytest"}
    assert task.repo_dir is not None and (task.repo_dir / "tests").is_dir()
    files = [path for path in task.repo_dir.rglob("*") if path.is_file()]
    assert sum(path.stat().st_size for path in files) < 16_000
    assert task.patch.startswith("diff --git ") and task.test_patch.startswith("diff --git ")
    assert all(not path.startswith("tests/") for path in paths_touched_by(task.patch))
    assert all(path.startswith("tests/") for path in paths_touched_by(task.test_patch))
    assert "```" in task.problem_statement  # an issue with a reproduction
    assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)


@pytest.mark.parametrize("task", BUILTIN, ids=lambda task: task.instance_id)
def test_a_builtin_task_fails_without_its_fix_and_passes_with_the_gold_patch(
    task: Task, tmp_path: Path
):
    with task_sandbox(task, tmp_path / "unfixed") as sandbox:
        unfixed = grade(task, sandbox, timeout_s=120)
    assert unfixed.outcome == "failed", unfixed.test_output
    assert unfixed.patch == ""
    assert all(unfixed.tests.get(t) == TestStatus.FAILED for t in task.FAIL_TO_PASS)
    assert all(unfixed.tests.get(t) == TestStatus.PASSED for t in task.PASS_TO_PASS)

    with task_sandbox(task, tmp_path / "fixed") as sandbox:
        apply_patch(sandbox, task.patch, allow_fuzz=False)
        fixed = grade(task, sandbox, timeout_s=120)

    assert fixed.outcome == "passed", (fixed.failing, fixed.test_output)
    for test in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        assert fixed.tests.get(test) == TestStatus.PASSED, test
    assert fixed.f2p.passed == len(task.FAIL_TO_PASS)
    assert fixed.p2p.passed == len(task.PASS_TO_PASS)
    # The captured patch is the gold fix (test files were reset, pytest's litter is ignored).
    assert paths_touched_by(fixed.patch) == paths_touched_by(task.patch)


# --- materialize --------------------------------------------------------------------------------


def test_materialize_gives_the_same_commit_twice_and_it_is_the_tasks_base_commit(tmp_path: Path):
    task = BUILTIN[0]
    first = materialize(task, tmp_path / "a")
    second = materialize(task, tmp_path / "b")
    assert first == second == task.base_commit
    assert _git(tmp_path / "a", "log", "--format=%an <%ae> %aI %cn %cI %s") == (
        "harness-gym <tasks@harness-gym.invalid> 2000-01-01T00:00:00+00:00 "
        "harness-gym 2000-01-01T00:00:00+00:00 base\n"
    )
    assert _git(tmp_path / "a", "status", "--porcelain") == ""


def test_the_base_commit_computed_without_git_equals_the_one_git_makes(tmp_path: Path):
    # Names whose order differs between plain sorting and git's ("a.b" < "a/" < "a0"),
    # an executable, a symlink, an empty directory (untracked by git) and nested trees.
    repo = tmp_path / "task" / "repo"
    for name in ("a.b", "a0", "a/x.py", "a/b/deep.txt", "bin/run.sh", "é.txt"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(f"{name}\n")
    (repo / "bin" / "run.sh").chmod(0o755)
    (repo / "link").symlink_to("a/x.py")
    (repo / "empty").mkdir()
    (tmp_path / "task" / "task.json").write_text(json.dumps(_row(base_commit="")))
    [task] = load_tasks(tmp_path / "task")
    assert materialize(task, tmp_path / "materialized") == task.base_commit


def test_build_litter_in_a_task_folder_changes_neither_the_commit_nor_the_diff(tmp_path: Path):
    source = tmp_path / "task"
    shutil.copytree(BUILTIN_SUITE_DIR / BUILTIN[0].instance_id, source)
    (source / "repo" / "__pycache__").mkdir()
    (source / "repo" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (source / "repo" / "stale.pyc").write_bytes(b"\0")
    [task] = load_tasks(source)
    assert task.base_commit == BUILTIN[0].base_commit

    repo = tmp_path / "repo"
    materialize(task, repo)
    assert not (repo / "stale.pyc").exists()
    (repo / "tests" / "__pycache__").mkdir()
    (repo / "tests" / "__pycache__" / "t.pyc").write_bytes(b"\0")
    assert _git(repo, "status", "--porcelain") == ""


def test_materialize_refuses_a_non_empty_destination(tmp_path: Path):
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "file").write_text("x")
    with pytest.raises(TaskError, match="not empty"):
        materialize(BUILTIN[0], tmp_path / "occupied")


def test_a_dataset_row_cannot_be_materialized_and_says_to_use_a_container():
    [row_task] = load_tasks([_row(image_name="swerebench/acme-widgets:1")])
    with pytest.raises(TaskError, match=r"container backend.*swerebench/acme-widgets:1"):
        materialize(row_task, Path("/nonexistent"))


def test_a_repo_that_changed_after_loading_is_caught_at_materialize(tmp_path: Path):
    source = tmp_path / "task"
    shutil.copytree(BUILTIN_SUITE_DIR / BUILTIN[0].instance_id, source)
    [task] = load_tasks(source)
    (source / "repo" / "README.md").write_text("edited\n")
    with pytest.raises(TaskError, match="reload"):
        materialize(task, tmp_path / "repo")


# --- loading and validation ---------------------------------------------------------------------


def test_load_tasks_accepts_task_objects_and_row_dicts():
    task = BUILTIN[0]
    assert load_tasks([task]) == [task]
    [from_row] = load_tasks([_row()])
    assert from_row.instance_id == "acme__widgets-1"
    assert from_row.repo_dir is None


def test_json_encoded_fields_are_decoded_and_unknown_fields_kept():
    task = Task.from_dict(
        _row(
            FAIL_TO_PASS=json.dumps(["a::b"]),
            PASS_TO_PASS="[]",
            install_config=json.dumps({"test_cmd": ["make", "pytest -rA"], "log_parser": "pytest"}),
            created_at="2025-01-01",
        )
    )
    assert task.FAIL_TO_PASS == ["a::b"] and task.PASS_TO_PASS == []
    assert task.test_cmd == "make\npytest -rA"
    assert task.extra == {"created_at": "2025-01-01"}
    assert Task.from_dict(task.to_dict()) == task


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"instance_id": ""}, "instance_id must be a non-empty string"),
        ({"FAIL_TO_PASS": "tests/t.py::x"}, "FAIL_TO_PASS is a string but not valid JSON"),
        ({"FAIL_TO_PASS": [1, 2]}, "FAIL_TO_PASS must be a list of test ids"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS is empty"),
        ({"PASS_TO_PASS": None}, "PASS_TO_PASS must be a list"),
        ({"patch": 3}, "patch must be a string, got int"),
        ({"problem_statement": "  "}, "problem_statement is empty"),
        ({"install_config": "{"}, "install_config is a string but not valid JSON"),
        ({"install_config": []}, "install_config must be an object"),
        ({"install_config": {"log_parser": "pytest"}}, "install_config.test_cmd is missing"),
        (
            {"install_config": {"test_cmd": "", "log_parser": "pytest"}},
            "test_cmd must be a non-empty",
        ),
        ({"install_config": {"test_cmd": "pytest"}}, "log_parser is missing; one of: .*pytest"),
        (
            {"install_config": {"test_cmd": "pytest", "log_parser": "nose"}},
            "unknown log_parser 'nose'; known parsers: .*junit.*register_log_parser",
        ),
        ({"image_name": 7}, "image_name must be a string or null"),
    ],
)
def test_a_bad_field_is_refused_with_what_was_expected(overrides: dict, message: str):
    with pytest.raises(TaskError, match=message):
        Task.from_dict(_row(**overrides))


def test_every_bad_field_is_reported_at_once():
    with pytest.raises(TaskError) as raised:
        Task.from_dict(_row(patch=None, FAIL_TO_PASS=[], install_config={}))
    message = str(raised.value)
    assert "'acme__widgets-1' is invalid" in message
    assert all(f in message for f in ("patch must", "FAIL_TO_PASS is empty", "test_cmd is missing"))


def test_a_missing_field_is_named():
    row = _row()
    del row["test_patch"], row["repo"]
    with pytest.raises(TaskError, match=r"missing required field.*repo, test_patch"):
        Task.from_dict(row)


def test_an_unknown_suite_name_lists_what_would_have_worked():
    with pytest.raises(
        TaskError,
        match=r"not 'builtin', not an existing directory or .jsonl file \(or .json, .parquet\)",
    ):
        load_tasks("no-such-suite")


def test_a_task_folder_without_task_json_or_repo_is_refused(tmp_path: Path):
    (tmp_path / "suite" / "a").mkdir(parents=True)
    with pytest.raises(TaskError, match=r"has no task.json"):
        load_tasks(tmp_path / "suite")
    (tmp_path / "suite" / "a" / "task.json").write_text(json.dumps(_row()))
    with pytest.raises(TaskError, match="has no repo/ folder"):
        load_tasks(tmp_path / "suite")


def test_a_task_json_error_names_the_file(tmp_path: Path):
    folder = tmp_path / "t"
    (folder / "repo").mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps(_row(FAIL_TO_PASS=7)))
    with pytest.raises(TaskError, match=r"t/task.json: task 'acme__widgets-1' is invalid"):
        load_tasks(folder)


def test_a_wrong_base_commit_in_task_json_is_refused(tmp_path: Path):
    folder = tmp_path / "t"
    shutil.copytree(BUILTIN_SUITE_DIR / BUILTIN[0].instance_id, folder)
    row = json.loads((folder / "task.json").read_text())
    (folder / "task.json").write_text(json.dumps({**row, "base_commit": "f" * 40}))
    with pytest.raises(TaskError, match="does not match its repo/"):
        load_tasks(folder)


def test_duplicate_instance_ids_are_refused():
    with pytest.raises(TaskError, match="appears twice"):
        load_tasks([_row(), _row()])


def test_a_row_without_repo_or_base_commit_is_refused():
    with pytest.raises(TaskError, match="neither repo_dir nor base_commit"):
        load_tasks([_row(base_commit="")])
