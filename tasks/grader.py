"""Grading a rollout with SWE-bench semantics, through the `Sandbox` seam only.

The candidate is whatever the agent left in `sandbox.workdir`. `grade`:

1. captures the agent's patch: everything changed since `base_commit`, untracked files included
   (`git add -A; git diff --cached --binary base_commit`), even if the agent committed;
2. resets every file the task's `test_patch` touches to `base_commit` (and deletes the ones the
   test patch creates), so an agent that edited or wrote the judging tests gains nothing;
3. applies `test_patch`, runs `install_config.test_cmd` under a timeout, parses the log;
4. passes only if every FAIL_TO_PASS test is PASSED or XFAIL and every PASS_TO_PASS test is
   PASSED, XFAIL or SKIPPED. A test missing from the log is a failure, so an empty parse (a
   crash, a collection error, a parser mismatch) never passes.

Timeouts and broken infrastructure (git unusable, test patch not applying, sandbox down) are
reported as `timeout` and `infra_error`, never as a plain `failed`.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from harness_gym.sandbox.base import ExecResult, Sandbox, SandboxError

from .diffs import paths_touched_by
from .log_parsers import TestStatus, get_log_parser
from .task import Task

__all__ = [
    "GradeResult",
    "GroupCounts",
    "Outcome",
    "PatchApplyError",
    "SandboxGitError",
    "apply_patch",
    "capture_patch",
    "grade",
    "judge_tests",
]

Outcome = Literal["passed", "failed", "timeout", "infra_error"]

F2P_OK = frozenset({TestStatus.PASSED, TestStatus.XFAIL})
P2P_OK = frozenset({TestStatus.PASSED, TestStatus.XFAIL, TestStatus.SKIPPED})
OUTPUT_TAIL_CHARS = 20_000
GIT_TIMEOUT_S = 120.0

# Command-scope git config: trusted even when the checkout belongs to another uid (a container
# volume), and it outranks anything the agent wrote into .git/config.
_GIT_ENV = {
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "GIT_CONFIG_KEY_1": "core.pager",
    "GIT_CONFIG_VALUE_1": "cat",
    "GIT_TERMINAL_PROMPT": "0",
}


def _git_env(sandbox: Sandbox) -> dict[str, str]:
    # Never search above the work dir: if the agent deleted .git, a repository enclosing the
    # sandbox (a checkout holding the temp dir) must not be the one staged and diffed.
    return {**_GIT_ENV, "GIT_CEILING_DIRECTORIES": posixpath.dirname(sandbox.workdir.rstrip("/"))}


_TEST_ENV = {"CI": "1", "PAGER": "cat", "NO_COLOR": "1", "TQDM_DISABLE": "1"}


class PatchApplyError(RuntimeError):
    """A diff did not apply; the message holds git's (and patch's) own explanation."""


@dataclass(frozen=True)
class GroupCounts:
    """How one test group (FAIL_TO_PASS or PASS_TO_PASS) fared."""

    total: int = 0
    passed: int = 0  # reached the group's bar
    failed: int = 0  # reported, with a status below the bar
    missing: int = 0  # never reported: counts as a failure


@dataclass
class GradeResult:
    outcome: Outcome
    tests: dict[str, TestStatus]  # every test the log reported, by node id
    patch: str  # the agent's changes against base_commit (git diff, binary-safe)
    test_output: str  # the tail of the test run's output
    duration_s: float
    f2p: GroupCounts = field(default_factory=GroupCounts)
    p2p: GroupCounts = field(default_factory=GroupCounts)
    failing: list[str] = field(default_factory=list)  # F2P/P2P tests that kept it from passing
    error: str | None = None  # why, for timeout and infra_error

    @property
    def resolved(self) -> bool:
        return self.outcome == "passed"

    def to_info(self) -> dict[str, Any]:
        """Plain JSON-ready dict (statuses as strings) for an env's `info`."""
        info = asdict(self)
        info["tests"] = {test: str(status) for test, status in self.tests.items()}
        return info


def grade(task: Task, sandbox: Sandbox, *, timeout_s: float = 600.0) -> GradeResult:
    """Grade the agent's working tree in `sandbox` against `task`'s tests.

    Grading rewrites the tree (test files reset, test patch applied, the index staged): grade a
    sandbox once, after the agent is done. `timeout_s` bounds the test command only.
    """
    started = time.monotonic()
    base = task.base_commit or "HEAD"
    patch = ""

    def finish(
        outcome: Outcome,
        *,
        error: str | None = None,
        tests: dict[str, TestStatus] | None = None,
        test_output: str = "",
        f2p: GroupCounts = GroupCounts(),
        p2p: GroupCounts = GroupCounts(),
        failing: list[str] | None = None,
    ) -> GradeResult:
        return GradeResult(
            outcome=outcome,
            tests=dict(tests or {}),
            patch=patch,
            test_output=test_output,
            duration_s=time.monotonic() - started,
            f2p=f2p,
            p2p=p2p,
            failing=failing or [],
            error=error,
        )

    try:
        patch = capture_patch(sandbox, base)
        _reset_test_files(sandbox, base, paths_touched_by(task.test_patch))
        apply_patch(sandbox, task.test_patch, allow_fuzz=False)
    except PatchApplyError as error:
        return finish("infra_error", error=f"test_patch did not apply: {error}")
    except (SandboxGitError, SandboxError) as error:
        return finish("infra_error", error=str(error))

    try:
        run = _run_tests(task, sandbox, timeout_s)
    except SandboxError as error:
        return finish("infra_error", error=f"the test command could not run: {error}")
    try:
        tests = get_log_parser(task.log_parser)(run.log)
    except Exception as error:  # a plugin parser's bug is not the agent's failure
        return finish("infra_error", error=f"log parser {task.log_parser!r} crashed: {error!r}")
    output_tail = run.log[-OUTPUT_TAIL_CHARS:]
    if run.result.timed_out:
        return finish(
            "timeout",
            error=f"the tests ran past {timeout_s:g}s and were killed",
            tests=tests,
            test_output=output_tail,
        )
    outcome, f2p, p2p, failing = judge_tests(task, tests)
    return finish(outcome, tests=tests, test_output=output_tail, f2p=f2p, p2p=p2p, failing=failing)


def judge_tests(
    task: Task, tests: dict[str, TestStatus]
) -> tuple[Outcome, GroupCounts, GroupCounts, list[str]]:
    """SWE-bench's verdict on parsed statuses: (outcome, f2p, p2p, failing tests)."""
    failing: list[str] = []

    def count(group: list[str], ok: frozenset[TestStatus]) -> GroupCounts:
        passed = sum(tests.get(test) in ok for test in group)
        missing = sum(test not in tests for test in group)
        failing.extend(test for test in group if tests.get(test) not in ok)
        return GroupCounts(len(group), passed, len(group) - passed - missing, missing)

    f2p = count(task.FAIL_TO_PASS, F2P_OK)
    p2p = count(task.PASS_TO_PASS, P2P_OK)
    return ("failed" if failing or not tests else "passed"), f2p, p2p, failing


# --- git in the sandbox -------------------------------------------------------------------------


class SandboxGitError(RuntimeError):
    """git in the sandbox failed (no repository, unknown base commit, a timeout)."""


def _succeeded(result: ExecResult) -> bool:
    return result.exit_code == 0 and not result.timed_out


def _explain(result: ExecResult) -> str:
    """A failed command's exit and the tail of what it said, for error messages."""
    said = (result.stderr + "\n" + result.stdout).strip()[-2000:]
    return f"(exit {result.exit_code}{', timed out' if result.timed_out else ''}) {said}"


def _git(sandbox: Sandbox, *args: str) -> ExecResult:
    result = sandbox.exec(
        ["git", *args], cwd=sandbox.workdir, env=_git_env(sandbox), timeout=GIT_TIMEOUT_S
    )
    if not _succeeded(result):
        raise SandboxGitError(f"git {args[0]} failed in {sandbox.workdir} {_explain(result)}")
    return result


def capture_patch(sandbox: Sandbox, base_commit: str = "HEAD") -> str:
    """The agent's changes against `base_commit`, new files included, binary-safe. Stages
    everything (the grader owns the index from here on). Raises `SandboxGitError`."""
    _git(sandbox, "add", "--all")
    diff = _git(
        sandbox,
        "diff",
        "--cached",
        "--binary",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        base_commit,
    )
    return diff.stdout


def _reset_test_files(sandbox: Sandbox, base_commit: str, paths: list[str]) -> None:
    """Put every path back as it was at `base_commit`; delete it if it did not exist there.
    One script, so a container backend pays one round trip, not one per file."""
    if not paths:
        return
    base = shlex.quote(base_commit)
    lines = [
        "set -e",
        "reset_path() {",
        '  rm -rf -- "$1"',
        f'  if git cat-file -e {base}:"$1" 2>/dev/null; then git checkout -q {base} -- "$1"; fi',
        "}",
        *(f"reset_path {shlex.quote(path)}" for path in paths),
    ]
    result = sandbox.exec(
        "\n".join(lines), cwd=sandbox.workdir, env=_git_env(sandbox), timeout=GIT_TIMEOUT_S
    )
    if not _succeeded(result):
        raise SandboxGitError(f"could not reset the test files to {base_commit} {_explain(result)}")


def apply_patch(
    sandbox: Sandbox, diff: str, *, allow_fuzz: bool = True, timeout_s: float = GIT_TIMEOUT_S
) -> None:
    """Apply a git diff to the sandbox's working tree (e.g. a gold patch, to validate a task).

    `git apply` first; with `allow_fuzz`, then `patch --fuzz=5` as SWE-bench's harness does for
    patches whose context drifted. Raises `PatchApplyError` with both tools' messages.
    """
    if not diff.strip():
        return
    data = diff.encode("utf-8", errors="surrogateescape")
    if not data.endswith(b"\n"):
        data += b"\n"  # a diff cut at its last line reads as "corrupt patch"
    attempts = [["git", "apply", "--verbose", "--whitespace=nowarn", "-"]]
    if allow_fuzz:
        attempts.append(["patch", "--batch", "--forward", "--fuzz=5", "-p1"])
    messages = []
    for command in attempts:
        result = sandbox.exec(
            command, cwd=sandbox.workdir, env=_git_env(sandbox), timeout=timeout_s, stdin=data
        )
        if _succeeded(result):
            return
        messages.append(f"{command[0]} {_explain(result)}")
    raise PatchApplyError("\n".join(messages))


# --- the test run -------------------------------------------------------------------------------


@dataclass
class _TestRun:
    result: ExecResult
    log: str  # stdout, stderr, then the JUnit report when the task names one


def _run_tests(task: Task, sandbox: Sandbox, timeout_s: float) -> _TestRun:
    junit_xml = task.install_config.get("junit_xml")
    command = task.test_cmd
    if junit_xml:
        # A report left behind (or planted by the agent) must not be read as this run's result.
        command = f"rm -f -- {shlex.quote(junit_xml)}\n{command}"
    result = sandbox.exec(command, cwd=sandbox.workdir, env=_TEST_ENV, timeout=timeout_s)
    log = result.stdout + ("\n" + result.stderr if result.stderr else "")
    if junit_xml and not result.timed_out:
        # Read through exec, like everything else, so every backend behaves the same.
        report = sandbox.exec(["cat", "--", junit_xml], cwd=sandbox.workdir, timeout=GIT_TIMEOUT_S)
        if report.exit_code == 0:  # no report: the tests stay missing, which fails the grade
            log += "\n" + report.stdout
    return _TestRun(result, log)
