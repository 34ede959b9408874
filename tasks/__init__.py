"""Task suites, loaders and the grader (installed as `harness_gym.tasks`).

    from harness_gym.tasks import grade, load_tasks, materialize

    tasks = load_tasks("builtin")
    materialize(tasks[0], Path("/tmp/rollout-0"))  # a git repo at tasks[0].base_commit
    # ... a sandbox holding that repo, an agent working in it, then:
    result = grade(tasks[0], sandbox, timeout_s=120)
    result.outcome, result.f2p, result.patch

Modules: `task` (the `Task` record), `loader` (suites, deterministic repos), `grader` (grading
through the sandbox seam, with a verdict the agent cannot forge: docs/reward-integrity.md),
`test_scope` (what is restored before the tests run), `hardened_run` (the grader's sandbox
commands), `sandbox_git` (git on a repository the agent controlled), `sandbox_grading` (the
grader's in-sandbox pytest plugin and unittest hooks), `grading_report` (reading their MAC'd
report), `validation` (is a task's gold patch passing every time?), `log_parsers` (test logs ->
statuses, a registry), `diffs` (paths a patch touches). The shipped suite lives in `builtin/`,
one folder per task.
"""

from __future__ import annotations

from .grader import (
    GradeResult,
    GroupCounts,
    Outcome,
    PatchApplyError,
    RepositoryLostError,
    SandboxGitError,
    apply_patch,
    capture_patch,
    grade,
    judge_tests,
)
from .loader import BUILTIN_SUITE_DIR, TaskSpec, load_tasks, materialize
from .log_parsers import (
    LogParser,
    TestStatus,
    UnknownLogParserError,
    get_log_parser,
    log_parser_names,
    parse_junit_xml,
    parse_pytest_log,
    parse_unittest_log,
    pytest_session_totals,
    register_log_parser,
)
from .task import Task, TaskError
from .validation import TaskValidation, validate_task

__all__ = [
    "BUILTIN_SUITE_DIR",
    "GradeResult",
    "GroupCounts",
    "LogParser",
    "Outcome",
    "PatchApplyError",
    "RepositoryLostError",
    "SandboxGitError",
    "Task",
    "TaskError",
    "TaskSpec",
    "TaskValidation",
    "TestStatus",
    "UnknownLogParserError",
    "apply_patch",
    "capture_patch",
    "get_log_parser",
    "grade",
    "judge_tests",
    "load_tasks",
    "log_parser_names",
    "materialize",
    "parse_junit_xml",
    "parse_pytest_log",
    "parse_unittest_log",
    "pytest_session_totals",
    "register_log_parser",
    "validate_task",
]
