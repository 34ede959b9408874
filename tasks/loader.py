"""Where tasks come from, and how a directory task becomes a git repository.

`load_tasks` reads a suite: `"builtin"`, a task directory (one folder per task: `task.json` +
`repo/`), a JSONL, JSON or Parquet file of SWE-rebench V2 / SWE-bench rows (as the datasets ship
them: list fields and `install_config` either native or JSON-encoded), a list of `Task`s (or row
dicts), or the name of an entry point in the `harness_gym.tasks` group (a callable returning any
of those; `name:arg` calls it with `arg`, e.g. `"family:heldout"`).

`materialize` copies a directory task's `repo/` and commits it once with fixed author, committer,
dates and message, so the base commit's hash depends only on the files: the same on every
machine, and equal to the `base_commit` that `load_tasks` gives the task.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from ..plugins import did_you_mean, plugin_names
from .git_hash import CommitIdentity, commit_hash
from .task import Task, TaskError

__all__ = ["BASE_COMMIT_IDENTITY", "BUILTIN_SUITE_DIR", "TaskSpec", "load_tasks", "materialize"]

BUILTIN_SUITE_DIR = Path(__file__).parent / "builtin"
ENTRY_POINT_GROUP = "harness_gym.tasks"

TaskSpec = str | os.PathLike[str] | Sequence[Task | Mapping[str, Any]]

# Build litter that must never reach a task's commit (it would change the hash) nor an agent's
# captured patch (the grader stages everything that is not ignored).
BUILD_LITTER = ("__pycache__", "*.pyc", ".pytest_cache", ".git")
GIT_EXCLUDES = "".join(f"{pattern}\n" for pattern in BUILD_LITTER if pattern != ".git")

# Fixed identity, time and message: the commit hash is then a pure function of the tree.
BASE_COMMIT_IDENTITY = CommitIdentity(
    name="harness-gym",
    email="tasks@harness-gym.invalid",
    epoch_s=946_684_800,  # 2000-01-01T00:00:00Z
    message="base",
)
# The user's own git config (signing, hooks, templates, autocrlf) must not leak into the commit.
GIT_ISOLATION = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def load_tasks(spec: TaskSpec, *, install_config: Mapping[str, Any] | None = None) -> list[Task]:
    """Load a task suite. `install_config` fills rows that have none (plain SWE-bench rows keep
    their test commands outside the dataset). Raises `TaskError` saying what is wrong, where."""
    tasks = _resolve(spec, install_config)
    if not tasks:
        raise TaskError(f"no tasks found in {spec!r}")
    seen: set[str] = set()
    for task in tasks:
        if task.instance_id in seen:
            raise TaskError(f"instance_id {task.instance_id!r} appears twice in {spec!r}")
        seen.add(task.instance_id)
    return [_with_base_commit(task) for task in tasks]


def materialize(task: Task, dest: Path) -> str:
    """Copy `task.repo_dir` to `dest` (absent or empty) as a git repo with one deterministic
    commit; return its hash."""
    if task.repo_dir is None:
        raise TaskError(
            f"task {task.instance_id!r} has no repo_dir to materialize: it is a dataset row; run "
            f"it with a container backend that starts from image_name={task.image_name!r}"
        )
    commit = _commit_tree(task.repo_dir, Path(dest))
    if task.base_commit and task.base_commit != commit:
        raise TaskError(
            f"task {task.instance_id!r}: {task.repo_dir} commits as {commit}, not as its "
            f"base_commit {task.base_commit}: its files changed since the suite was loaded; "
            "reload the suite"
        )
    return commit


# --- sources ------------------------------------------------------------------------------------


def _resolve(spec: Any, install_config: Mapping[str, Any] | None) -> list[Task]:
    if isinstance(spec, (str, os.PathLike)):
        if os.fspath(spec) == "builtin":
            return _load_directory(BUILTIN_SUITE_DIR)
        path = Path(spec).expanduser()
        if path.is_dir():
            return _load_directory(path)
        if path.is_file():
            return _load_rows_file(path, install_config)
        if isinstance(spec, str) and (suite := _from_entry_point(spec)) is not None:
            return _resolve(suite, install_config)
        installed = plugin_names(ENTRY_POINT_GROUP)
        hint = did_you_mean(str(spec), ["builtin", *installed])
        raise TaskError(
            f"task suite {spec!r}{hint} is not 'builtin', not an existing directory or .jsonl file "
            "(or .json, .parquet), "
            f"and not an entry point in {ENTRY_POINT_GROUP!r} "
            f"(installed: {', '.join(installed) or 'none'})"
        )
    if isinstance(spec, Iterable):
        return [_task_from_item(item, install_config, f"item {i}") for i, item in enumerate(spec)]
    raise TaskError(
        f"tasks must be a suite name, a path or a list of Task objects, got {type(spec).__name__}"
    )


def _entry_point(name: str) -> Any:
    matches = entry_points(group=ENTRY_POINT_GROUP, name=name)
    return next(iter(matches), None)


def _from_entry_point(spec: str) -> Any:
    """What the entry point `spec` names makes, or None: `name` is called with no argument,
    `name:arg` (when no entry point is called that) with `arg`, as engine specs are
    (`family:heldout`)."""
    arg: str | None = None
    entry = _entry_point(spec)
    if entry is None and ":" in spec:
        name, _, arg = spec.partition(":")
        entry = _entry_point(name)
    if entry is None:
        return None
    loaded = entry.load()
    if not callable(loaded):
        if arg is not None:
            raise TaskError(f"task suite entry point {spec.partition(':')[0]!r} takes no argument")
        return loaded
    return loaded() if arg is None else loaded(arg)


def _task_from_item(item: Any, install_config: Mapping[str, Any] | None, where: str) -> Task:
    if isinstance(item, Task):
        return item
    if isinstance(item, Mapping):
        row = dict(item)
        if install_config is not None and "install_config" not in row:
            row["install_config"] = dict(install_config)
        try:
            return Task.from_dict(row)
        except TaskError as error:
            if "install_config" not in row:
                raise TaskError(
                    f"{where}: {error}\n  (plain SWE-bench rows carry no install_config: pass "
                    "install_config={'test_cmd': ..., 'log_parser': ...} to gymnasium.make "
                    "or load_tasks)"
                ) from None
            raise TaskError(f"{where}: {error}") from None
    raise TaskError(f"{where}: expected a Task or a row dict, got {type(item).__name__}")


def _load_rows_file(path: Path, install_config: Mapping[str, Any] | None) -> list[Task]:
    if path.suffix == ".parquet":
        rows = _read_parquet(path)
        return [_task_from_item(row, install_config, f"{path}[{i}]") for i, row in enumerate(rows)]
    if path.suffix == ".json":  # one JSON list of rows
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise TaskError(f"{path}: not valid JSON: {error}") from None
        if not isinstance(rows, list):
            raise TaskError(f"{path}: a .json task file must hold a list of rows")
        return [_task_from_item(row, install_config, f"{path}[{i}]") for i, row in enumerate(rows)]
    if path.suffix != ".jsonl":
        raise TaskError(
            f"{path}: task files must be .jsonl (one row a line), .json (a list) or .parquet"
        )
    tasks = []
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise TaskError(f"{path}:{line_number}: not valid JSON: {error}") from None
            tasks.append(_task_from_item(row, install_config, f"{path}:{line_number}"))
    return tasks


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    """Rows of a Parquet file (the Hugging Face datasets' format) as plain Python values."""
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise TaskError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        return parquet.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ...
        raise TaskError(f"{path}: not a readable Parquet file: {error}") from None


def _load_directory(path: Path) -> list[Task]:
    if (path / "task.json").is_file():
        return [_load_task_folder(path)]
    tasks = []
    for folder in sorted(path.iterdir()):
        if not folder.is_dir() or folder.name.startswith((".", "_")):
            continue
        if not (folder / "task.json").is_file():
            raise TaskError(
                f"{folder} has no task.json: a task directory holds one folder per task, "
                "each with task.json and repo/"
            )
        tasks.append(_load_task_folder(folder))
    return tasks


def _load_task_folder(folder: Path) -> Task:
    task_file = folder / "task.json"
    try:
        row = json.loads(task_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise TaskError(f"{task_file}: not valid JSON: {error}") from None
    repo_dir = folder / "repo"
    if not repo_dir.is_dir():
        raise TaskError(f"{folder} has no repo/ folder (the source tree before the fix)")
    task = _task_from_item(row, None, str(task_file))
    return replace(task, repo_dir=repo_dir)


def _with_base_commit(task: Task) -> Task:
    if task.repo_dir is None:
        if not task.base_commit:
            raise TaskError(
                f"task {task.instance_id!r} has neither repo_dir nor base_commit: the grader "
                "could not tell the agent's changes from the original code"
            )
        return task
    if not task.repo_dir.is_dir():
        raise TaskError(f"task {task.instance_id!r}: repo_dir {task.repo_dir} is not a directory")
    commit = commit_hash(task.repo_dir, BASE_COMMIT_IDENTITY, BUILD_LITTER)
    if task.base_commit and task.base_commit != commit:
        raise TaskError(
            f"task {task.instance_id!r}: base_commit {task.base_commit} does not match its "
            f"repo/ (which commits as {commit}); drop base_commit from task.json or fix it"
        )
    return replace(task, base_commit=commit)


# --- deterministic commits ----------------------------------------------------------------------


def _commit_tree(source: Path, dest: Path) -> str:
    if dest.exists() and any(dest.iterdir()):
        raise TaskError(f"cannot materialize into {dest}: it exists and is not empty")
    shutil.copytree(
        source,
        dest,
        symlinks=True,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(*BUILD_LITTER),
    )
    _git(dest, "init", "--quiet", "--initial-branch=main")
    _git(dest, "add", "--all", "--force")
    _git(
        dest,
        "commit",
        "--quiet",
        "--no-verify",
        "--allow-empty",
        "-m",
        BASE_COMMIT_IDENTITY.message,
    )
    (dest / ".git" / "info").mkdir(exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text(GIT_EXCLUDES)
    return _git(dest, "rev-parse", "HEAD").strip()


def _git(repo: Path, *args: str) -> str:
    try:
        completed = subprocess.run(
            ["git", "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false", *args],
            cwd=repo,
            env={**os.environ, **GIT_ISOLATION, **BASE_COMMIT_IDENTITY.git_env()},
            capture_output=True,
            text=True,
            check=True,
        )
    except FileNotFoundError:
        raise TaskError("git is not installed; directory tasks are materialized with git") from None
    except subprocess.CalledProcessError as error:
        raise TaskError(f"git {' '.join(args)} failed in {repo}: {error.stderr.strip()}") from None
    return completed.stdout
