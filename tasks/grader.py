"""Grading a rollout: the verdict depends only on what the code under test does.

The candidate is whatever the agent left in `sandbox.workdir`. `grade` first makes sure no
process the agent started still runs (`Sandbox.quiesce()`: a kill unless none ran since the
episode's own), then:

1. captures the agent's patch against `base_commit` (new files included, binary-safe, from a
   temporary index). An agent that deleted or replaced `.git` broke its own repo, not ours: a
   directory task's base commit is rebuilt from its `repo/` (same hash) and the agent's files
   are graded against it, with a note; a dataset row's base exists only in its image, so that
   rollout is `failed` (`repository_lost`);
2. puts the test scope back as the task has it (`test_scope`: test directories and files,
   conftests, pytest configuration, start-up hooks, bytecode caches of tests), removes what the
   agent added there or planted for pytest to load, and applies the task's test patch;
3. runs the test command with grader-owned settings and the grader's in-sandbox reporter
   (`sandbox_grading`): per-test outcomes travel on a MAC'd channel the code under test cannot
   write, and the runner is watched for tampering;
4. passes only if every FAIL_TO_PASS and PASS_TO_PASS test PASSED: XFAIL, XPASS, SKIPPED and
   ERROR are not passes, a test missing from the report is a failure, and so is a run whose
   report is incomplete. With `exact_test_set` (task `install_config` key, or `grade(...,
   exact_test_set=True)`) no other reported test may fail or error either.

`GradeResult.reason` says why: `tests_failed`, `tampered` (a check fired; `error` says which),
`incomplete` (the runner did not finish its report: os._exit, a crash), `untrusted_log` (a log
parser without a reporter read output it cannot trust), `repository_lost`, `timeout`, and for
`infra_error`: `runner_missing` (no test runner in the sandbox), `test_patch` (it does not apply
to the task's files: the task's fault, not the agent's), `sandbox`, `log_parser`.

Tasks whose log parser has no in-sandbox reporter (a parser registered for another framework)
are graded from the log alone, as SWE-bench does; docs/reward-integrity.md lists what that
leaves open.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..sandbox.base import Sandbox, SandboxError

from .diffs import paths_touched_by
from .grading_report import RunnerReport, read_report
from .hardened_run import (
    BaseCommitMissing,
    Prepared,
    Survey,
    TestRun,
    collect,
    origin_problems,
    prepare,
    run_tests,
    runner_kind,
    survey,
    tracer_problems,
    verify_report,
)
from .log_parsers import TestStatus, get_log_parser, junit_summary_problems
from .sandbox_git import (
    PatchApplyError,
    RepositoryLostError,
    SandboxGitError,
    apply_patch,
    capture_patch,
    ensure_base_commit,
)
from .task import Task

__all__ = [
    "GradeResult",
    "GroupCounts",
    "Outcome",
    "PatchApplyError",
    "Reason",
    "RepositoryLostError",
    "SandboxGitError",
    "apply_patch",
    "capture_patch",
    "grade",
    "judge_tests",
]

Outcome = Literal["passed", "failed", "timeout", "infra_error"]
Reason = Literal[
    "tests_failed",
    "tampered",
    "incomplete",
    "untrusted_log",
    "repository_lost",
    "timeout",
    "runner_missing",
    "test_patch",
    "sandbox",
    "log_parser",
]

Verdict = tuple[Outcome, Reason, str]  # when a run's statuses cannot be believed

F2P_OK = frozenset({TestStatus.PASSED})  # only a genuine pass proves anything
P2P_OK = frozenset({TestStatus.PASSED})
OUTPUT_TAIL_CHARS = 20_000


@dataclass(frozen=True)
class GroupCounts:
    """How one test group (FAIL_TO_PASS or PASS_TO_PASS) fared."""

    total: int = 0
    passed: int = 0  # PASSED
    failed: int = 0  # reported, with another status
    missing: int = 0  # never reported: counts as a failure


@dataclass
class GradeResult:
    outcome: Outcome
    tests: dict[str, TestStatus]  # every test the runner reported, by id
    patch: str  # the agent's changes against base_commit (git diff, binary-safe)
    test_output: str  # the tail of the test run's output
    duration_s: float
    f2p: GroupCounts = field(default_factory=GroupCounts)
    p2p: GroupCounts = field(default_factory=GroupCounts)
    failing: list[str] = field(default_factory=list)  # F2P/P2P tests that kept it from passing
    error: str | None = None  # why, for anything but a pass or plainly failing tests
    notes: list[str] = field(default_factory=list)  # what the grader repaired or removed first
    reason: Reason | None = None  # None when passed

    @property
    def resolved(self) -> bool:
        return self.outcome == "passed"

    def to_info(self) -> dict[str, Any]:
        """Plain JSON-ready dict (statuses as strings) for an env's `info`."""
        info = asdict(self)
        info["tests"] = {test: str(status) for test, status in self.tests.items()}
        return info


def grade(
    task: Task,
    sandbox: Sandbox,
    *,
    timeout_s: float = 600.0,
    exact_test_set: bool | None = None,
) -> GradeResult:
    """Grade the agent's working tree in `sandbox` against `task`'s tests.

    Grading rewrites the tree (test scope restored, test patch applied): grade a sandbox once,
    after the agent is done. `timeout_s` bounds the test command only. `exact_test_set`
    overrides the task's `install_config.exact_test_set` (see the module doc).
    """
    started = time.monotonic()
    base = task.base_commit or "HEAD"
    patch = ""
    notes: list[str] = []
    if exact_test_set is None:
        exact_test_set = bool(task.install_config.get("exact_test_set", False))

    def finish(outcome: Outcome, reason: Reason | None, *, error: str | None = None,
               tests: dict[str, TestStatus] | None = None, test_output: str = "",
               f2p: GroupCounts = GroupCounts(), p2p: GroupCounts = GroupCounts(),
               failing: list[str] | None = None) -> GradeResult:  # fmt: skip
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
            notes=notes,
            reason=reason,
        )

    try:
        # Nothing the agent left running may touch the tree while the grader works in it
        # (invariant 7), whoever calls grade(): a no-op when the episode has just killed.
        sandbox.quiesce()
        try:
            found = survey(task, sandbox, base)
        except BaseCommitMissing:
            if note := ensure_base_commit(task, sandbox, base):
                notes.append(note)
            found = survey(task, sandbox, base)
        patch = found.patch
        if found.planted_above:
            return finish("failed", "tampered", error=(
                "pytest configuration planted above the work tree, where pytest would read it: "
                + ", ".join(found.planted_above)
            ))  # fmt: skip
        prepared = prepare(task, sandbox, base, found)
        run = run_tests(task, sandbox, prepared, timeout_s)
        collect(task, sandbox, prepared, run)
    except PatchApplyError as error:
        return finish("infra_error", "test_patch", error=f"test_patch did not apply: {error}")
    except RepositoryLostError as error:
        return finish("failed", "repository_lost", error=str(error))
    except (SandboxGitError, SandboxError, BaseCommitMissing) as error:
        return finish("infra_error", "sandbox", error=f"{type(error).__name__}: {error}")
    notes += _repair_notes(prepared, found)
    if prepared.doctored:
        return finish("failed", "tampered", error=(
            "the repository's git objects were altered: restored test files do not hash to the "
            f"task's blobs ({', '.join(prepared.doctored[:5])})"
        ))  # fmt: skip
    output_tail = run.log[-OUTPUT_TAIL_CHARS:]
    if run.timed_out:
        return finish("timeout", "timeout", test_output=output_tail,
                      error=f"the tests ran past {timeout_s:g}s and were killed")  # fmt: skip

    tests, verdict = _statuses(task, run, prepared, found, notes)
    outcome, f2p, p2p, failing = judge_tests(task, tests, exact_test_set=exact_test_set)
    reason: Reason | None = None if outcome == "passed" else "tests_failed"
    error = None
    if verdict is not None:  # the run cannot be believed, whatever the statuses say
        outcome, reason, error = verdict
    return finish(outcome, reason, error=error, tests=tests, test_output=output_tail,
                  f2p=f2p, p2p=p2p, failing=failing)  # fmt: skip


def _statuses(
    task: Task, run: TestRun, prepared: Prepared, found: Survey, notes: list[str]
) -> tuple[dict[str, TestStatus], Verdict | None]:
    """The per-test statuses, and the verdict when the run cannot be judged on them."""
    kind = runner_kind(task)
    report = read_report(run.channel, prepared.keys)
    try:
        text = (run.junit or "") if task.log_parser == "junit" else run.log
        parsed = get_log_parser(task.log_parser)(text)
    except Exception as error:  # a plugin parser's bug is not the agent's failure
        if kind is None or (kind == "junit" and not report.started):
            why = f"log parser {task.log_parser!r} crashed: {error!r}"
            return {}, ("infra_error", "log_parser", why)
        parsed = {}  # only cross-checked against the runner's report
    if kind is None or (kind == "junit" and not report.started):
        return _log_only(task, run, parsed)

    judged = set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS)
    tampered = [*report.tampered]
    if report.forged:
        tampered.append(f"{report.forged} record(s) on the grader's channel failed verification")
    tampered += verify_report(report, prepared, found)
    tampered += origin_problems(report, judged, prepared)
    tampered += tracer_problems(report, prepared)
    statuses = report.statuses
    if tampered:
        return statuses, ("failed", "tampered", "tampered: " + "; ".join(tampered[:5]))
    if report.errors:
        why = "the grader's plugin failed: " + "; ".join(report.errors[:3])
        return statuses, ("failed", "incomplete", why)
    if not report.started and _runner_missing(run):
        runner = "pytest" if kind != "unittest" else "python"
        return statuses, ("infra_error", "runner_missing", (
            f"no test runner in the sandbox: {runner} cannot be run there (exit "
            f"{run.result.exit_code}); install it in the image. Output: {run.log[-500:].strip()}"
        ))  # fmt: skip
    if why := report.incomplete():
        return statuses, ("failed", "incomplete", f"{why} (exit {run.result.exit_code})")
    notes.extend(_cross_check(parsed, report))
    return statuses, None


# What the interpreter or the shell says when the runner is not there. No code of the agent's
# runs before the grader's plugin (the work tree's shadowing modules are removed), so nothing
# but a missing runner prints it in a run that never reported.
_NO_RUNNER = re.compile(
    r"No module named '?pytest'?\s*$|: (pytest|python3?): (command )?not found", re.M
)


def _runner_missing(run: TestRun) -> bool:
    return run.result.exit_code == 127 or run.probe_failed or bool(_NO_RUNNER.search(run.log))


def _log_only(
    task: Task, run: TestRun, parsed: dict[str, TestStatus]
) -> tuple[dict[str, TestStatus], Verdict | None]:
    """A run with no in-sandbox reporter: the log (or the task's JUnit report) is all there is."""
    if task.log_parser == "junit":
        if run.junit is None and task.install_config.get("junit_xml"):
            return parsed, ("failed", "incomplete", "the test command wrote no JUnit report")
        if problem := junit_summary_problems(run.junit or run.log):
            return parsed, ("failed", "untrusted_log", f"untrusted JUnit report: {problem}")
    return parsed, None


def _cross_check(parsed: dict[str, TestStatus], report: RunnerReport) -> list[str]:
    """Tests the output claims passed that the runner did not: printed by the code under test."""
    claimed = [t for t, s in parsed.items() if s == TestStatus.PASSED]
    forged = [t for t in claimed if report.statuses.get(t) != TestStatus.PASSED]
    if not forged:
        return []
    return [
        f"the test output claims {len(forged)} pass(es) the runner did not report (printed by "
        f"the code under test?), e.g. {forged[0]}; graded on the runner's report"
    ]


def _repair_notes(prepared: Prepared, found: Survey) -> list[str]:
    notes = []
    edited = sorted(
        path for path in paths_touched_by(found.patch)
        if path in found.base and path in prepared.expected and path not in found.kept_configs
    )  # fmt: skip
    if edited:
        notes.append(
            f"restored {len(edited)} test file(s) the agent changed: " + ", ".join(edited[:8])
        )
    if prepared.plan.neutralised:
        shown = ", ".join(prepared.plan.neutralised[:8])
        notes.append(
            f"removed {len(prepared.plan.neutralised)} file(s) the agent added that pytest or "
            f"Python would load (test files, conftests, configuration, start-up hooks): {shown}"
        )
    if prepared.swept:
        notes.append(
            f"removed {len(prepared.swept)} file(s) the agent added to test directories: "
            + ", ".join(prepared.swept[:8])
        )
    return notes


def judge_tests(
    task: Task, tests: dict[str, TestStatus], *, exact_test_set: bool = False
) -> tuple[Outcome, GroupCounts, GroupCounts, list[str]]:
    """The verdict on statuses: (outcome, f2p, p2p, failing tests). Only PASSED counts for
    FAIL_TO_PASS and PASS_TO_PASS. With `exact_test_set`, any other reported test that FAILED
    or ERRORed is failing too."""
    failing: list[str] = []

    def count(group: list[str], ok: frozenset[TestStatus]) -> GroupCounts:
        passed = sum(tests.get(test) in ok for test in group)
        missing = sum(test not in tests for test in group)
        failing.extend(test for test in group if tests.get(test) not in ok)
        return GroupCounts(len(group), passed, len(group) - passed - missing, missing)

    f2p = count(task.FAIL_TO_PASS, F2P_OK)
    p2p = count(task.PASS_TO_PASS, P2P_OK)
    if exact_test_set:
        judged = set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS)
        failing.extend(
            test
            for test, status in tests.items()
            if test not in judged and status in (TestStatus.FAILED, TestStatus.ERROR)
        )
    return ("failed" if failing or not tests else "passed"), f2p, p2p, failing
