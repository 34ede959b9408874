"""`validate_task`: does a task's gold patch pass, every time? Catches flaky tasks before they
reach training, where a test that passes by luck turns into reward noise.

    report = validate_task(task, load_sandbox("bwrap"), runs=3)
    report.ok, report.problems, report.flaky   # {test id: [status of run 1, 2, 3]}

Each run gets a fresh sandbox (the materialized repo for a directory task, `image_name` for a
dataset row), applies the gold patch and grades. A test whose status differs between runs is
flaky; a run that is not `passed` is a problem; a gold patch that does not apply stops it at once.
`check_unfixed=True` adds SWE-bench's other half: without the fix, F2P fails and P2P passes;
`unfixed_runs` repeats that side too, so a test that flakes only without the fix (cachetools
7.1.7's `RRCache` test, random eviction, once failed there) shows as flaky, not as a wrong
PASS_TO_PASS list.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..sandbox.base import SandboxBackend, SandboxSpec

from .grader import P2P_OK, GradeResult, PatchApplyError, apply_patch, grade
from .loader import materialize
from .log_parsers import TestStatus
from .mine.envs import env_mounts
from .task import Task

__all__ = ["MISSING", "TaskValidation", "validate_task"]

MISSING = "MISSING"  # a test that one run reported and another did not


@dataclass
class TaskValidation:
    task_id: str
    runs: list[GradeResult] = field(default_factory=list)
    # test -> its status in each run (the gold runs; the unfixed runs when only those differ)
    flaky: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    unfixed_runs: list[GradeResult] = field(default_factory=list)  # check_unfixed's runs

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unfixed(self) -> GradeResult | None:
        """The first run without the gold patch (None without `check_unfixed`)."""
        return self.unfixed_runs[0] if self.unfixed_runs else None


def validate_task(
    task: Task,
    backend: SandboxBackend,
    *,
    runs: int = 3,
    timeout_s: float = 600.0,
    env: Mapping[str, str] | None = None,
    check_unfixed: bool = False,
    unfixed_runs: int = 1,
) -> TaskValidation:
    """Grade the gold patch `runs` times in fresh sandboxes and compare per-test statuses.
    `env` is added to the sandbox's environment (e.g. a PATH holding the right python). With
    `check_unfixed`, `unfixed_runs` more runs without the gold patch must each fail every
    FAIL_TO_PASS test and pass every PASS_TO_PASS test (else the task's test lists are wrong),
    and are compared with each other as the gold runs are."""
    report = TaskValidation(task.instance_id)
    if check_unfixed:
        report.unfixed_runs = [_grade_once(task, backend, None, timeout_s, env)
                               for _ in range(max(1, unfixed_runs))]  # fmt: skip
        passing = [t for t in task.FAIL_TO_PASS
                   if any(r.tests.get(t) == TestStatus.PASSED for r in report.unfixed_runs)]
        broken = [t for t in task.PASS_TO_PASS
                  if any(r.tests.get(t) not in P2P_OK for r in report.unfixed_runs)]  # fmt: skip
        if passing:
            report.problems.append(f"FAIL_TO_PASS test(s) pass without the fix: {passing}")
        if broken:
            report.problems.append(f"PASS_TO_PASS test(s) do not pass without the fix: {broken}")
    for number in range(1, runs + 1):
        try:
            result = _grade_once(task, backend, task.patch, timeout_s, env)
        except PatchApplyError as error:
            report.problems.append(f"the gold patch does not apply: {error}")
            return report
        report.runs.append(result)
        if result.outcome != "passed":
            why = result.error or f"failing: {', '.join(result.failing)}"
            report.problems.append(f"run {number}: gold patch graded {result.outcome} ({why})")
    report.flaky = {**_changed(report.unfixed_runs), **_changed(report.runs)}
    if report.flaky:
        report.problems.append(
            f"{len(report.flaky)} test(s) changed status between identical runs (flaky): "
            + ", ".join(sorted(report.flaky)[:10])
        )
    return report


def _changed(results: list[GradeResult]) -> dict[str, list[str]]:
    """Each test whose status is not the same in every one of `results`, with its statuses."""
    changed = {}
    for test in sorted({test for result in results for test in result.tests}):
        statuses = [str(result.tests.get(test, MISSING)) for result in results]
        if len(set(statuses)) > 1:
            changed[test] = statuses
    return changed


def _grade_once(
    task: Task,
    backend: SandboxBackend,
    patch: str | None,
    timeout_s: float,
    env: Mapping[str, str] | None,
) -> GradeResult:
    """A fresh sandbox at the base commit, `patch` applied (raises `PatchApplyError`), graded."""
    with tempfile.TemporaryDirectory(prefix="harness-gym-validate-") as scratch:
        spec = SandboxSpec(image=task.image_name, env=dict(env or {}), label="validate",
                           ro_mounts=env_mounts(task, backend))
        if task.repo_dir is not None:
            spec.repo = Path(scratch) / "repo"
            materialize(task, spec.repo)
        with backend.create(spec) as sandbox:
            if patch is not None:
                apply_patch(sandbox, patch)
            return grade(task, sandbox, timeout_s=timeout_s)
