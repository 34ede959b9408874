"""`Task`: one SWE-style problem, with SWE-rebench-V2 field names, validated on construction.

Rows from SWE-rebench V2 and SWE-bench arrive with some fields JSON-encoded (`FAIL_TO_PASS` as a
JSON list string, `install_config` as a JSON object string); `Task` decodes them, so a row dict
can be splatted in as it is. Every bad field is reported at once, with what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .log_parsers import get_log_parser, log_parser_names

__all__ = ["Task", "TaskError"]


class TaskError(ValueError):
    """A task definition is malformed, or a task source cannot be read."""


@dataclass(frozen=True)
class Task:
    """One problem: the issue text, the gold fix, the tests that judge a fix, and the repo.

    `repo_dir` is set for directory tasks (a source tree materialized into a git repo, see
    `harness_gym.tasks.materialize`); rows from a JSONL file have no `repo_dir` and are run in a
    container built from `image_name`, whose checkout sits at `base_commit`.

    `install_config` holds `test_cmd` (a shell command, or a list run one after another),
    `log_parser` (a name in `harness_gym.tasks.log_parser_names()`), optionally `install` (run
    when an image is built, never by the grader), `junit_xml` (a report path, relative to the
    repo, that the grader reads after the run and hands to the parser instead of the output;
    `"auto"`: pytest writes it to a random path outside the repo, see `harness_gym.tasks.grader`)
    and `exact_test_set` (true: no test outside FAIL_TO_PASS/PASS_TO_PASS may fail either).
    """

    instance_id: str
    repo: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    install_config: dict[str, Any]
    base_commit: str = ""
    image_name: str | None = None
    repo_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # row fields this library doesn't use

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("FAIL_TO_PASS", "PASS_TO_PASS", "install_config"):  # rows JSON-encode these
            decoded = _decode_json_field(getattr(self, name), name, problems)
            object.__setattr__(self, name, decoded)
        if isinstance(self.repo_dir, str):
            object.__setattr__(self, "repo_dir", Path(self.repo_dir))
        problems += _field_problems(self)
        if problems:
            label = self.instance_id if isinstance(self.instance_id, str) else "<no instance_id>"
            raise TaskError(
                f"task {label!r} is invalid:\n" + "\n".join(f"  - {p}" for p in problems)
            )

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Task:
        """Build from a SWE-rebench V2 / SWE-bench row or a `task.json`; fields this library
        doesn't use (`created_at`, `version`, `hints_text`, ...) are kept in `extra`."""
        if not isinstance(row, Mapping):
            raise TaskError(f"a task must be a JSON object, got {type(row).__name__}")
        known = {f.name for f in fields(cls)} - {"extra"}
        missing = [f.name for f in fields(cls) if f.name in _REQUIRED and f.name not in row]
        if missing:
            label = row.get("instance_id", "<no instance_id>")
            raise TaskError(
                f"task {label!r} is missing required field(s) {', '.join(missing)} "
                f"(SWE-rebench V2 field names; required: {', '.join(sorted(_REQUIRED))})"
            )
        extra = {key: value for key, value in row.items() if key not in known}
        return cls(**{key: value for key, value in row.items() if key in known}, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The row form (JSON-ready), `extra` fields merged back in; `repo_dir` is left out."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "repo_dir"}
        return {**row.pop("extra"), **row}

    @property
    def test_cmd(self) -> str:
        """The test command as one shell script (a list of commands runs line by line, each
        running even when an earlier one failed, so every framework's summary gets printed)."""
        command = self.install_config["test_cmd"]
        return command if isinstance(command, str) else "\n".join(command)

    @property
    def log_parser(self) -> str:
        return self.install_config["log_parser"]


_REQUIRED = frozenset(
    {
        "instance_id",
        "repo",
        "problem_statement",
        "patch",
        "test_patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "install_config",
    }
)


def _decode_json_field(value: Any, name: str, problems: list[str]) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        problems.append(f"{name} is a string but not valid JSON ({error})")
        return value


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _field_problems(task: Task) -> list[str]:
    problems: list[str] = []
    if not isinstance(task.instance_id, str) or not task.instance_id.strip():
        problems.append(f"instance_id must be a non-empty string, got {task.instance_id!r}")
    for name in ("repo", "problem_statement", "patch", "test_patch", "base_commit"):
        value = getattr(task, name)
        if not isinstance(value, str):
            problems.append(f"{name} must be a string, got {type(value).__name__}")
    if isinstance(task.problem_statement, str) and not task.problem_statement.strip():
        problems.append("problem_statement is empty: the agent would have nothing to solve")
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = getattr(task, name)
        if not _is_str_list(value):
            problems.append(
                f"{name} must be a list of test ids (strings), or a JSON string of one; "
                f"got {type(value).__name__}"
            )
    if _is_str_list(task.FAIL_TO_PASS) and not task.FAIL_TO_PASS:
        problems.append("FAIL_TO_PASS is empty: no test would show that the fix works")
    if task.image_name is not None and not isinstance(task.image_name, str):
        problems.append(
            f"image_name must be a string or null, got {type(task.image_name).__name__}"
        )
    if task.repo_dir is not None and not isinstance(task.repo_dir, Path):
        problems.append(f"repo_dir must be a path, got {type(task.repo_dir).__name__}")
    if not isinstance(task.extra, dict):
        problems.append(f"extra must be a dict, got {type(task.extra).__name__}")
    problems += _install_config_problems(task.install_config)
    return problems


def _install_config_problems(config: Any) -> list[str]:
    if not isinstance(config, dict):
        expected = "an object (or a JSON string of one) with test_cmd and log_parser"
        return [f"install_config must be {expected}, got {type(config).__name__}"]
    problems: list[str] = []
    command = config.get("test_cmd")
    if command is None:
        problems.append("install_config.test_cmd is missing (the command that runs the tests)")
    elif not (isinstance(command, str) and command.strip()) and not (
        _is_str_list(command) and command and all(part.strip() for part in command)
    ):
        problems.append(
            "install_config.test_cmd must be a non-empty string or list of strings, "
            f"got {command!r}"
        )
    parser = config.get("log_parser")
    if parser is None:
        problems.append(
            f"install_config.log_parser is missing; one of: {', '.join(log_parser_names())}"
        )
    elif not isinstance(parser, str):
        problems.append(f"install_config.log_parser must be a string, got {parser!r}")
    else:
        try:
            get_log_parser(parser)
        except KeyError as error:
            problems.append(f"install_config.log_parser: {error}")
    install = config.get("install")
    if install is not None and not isinstance(install, str) and not _is_str_list(install):
        problems.append("install_config.install must be a string or list of strings")
    if not isinstance(config.get("exact_test_set", False), bool):
        problems.append("install_config.exact_test_set must be true or false")
    junit_xml = config.get("junit_xml")
    if junit_xml is not None and not (isinstance(junit_xml, str) and junit_xml.strip()):
        problems.append(
            'install_config.junit_xml must be a report path relative to the repo, or "auto"'
        )
    return problems
