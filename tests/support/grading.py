"""The grader tests' scaffolding: the fixture tasks, the backends (skipped where one cannot run
here), an agent's moves in a fresh sandbox of a task, the grade, and the verdict asserted.

The grader suites (test_grader*.py, test_grade_alone.py) and test_sandbox_attacks.py drive the
real grader in real sandboxes; each used to carry its own copy of these steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_gym.rewards import RewardConfig
from harness_gym.tasks import GradeResult, Task, apply_patch, grade, load_tasks

from harness_gym.sandbox import load_sandbox
from harness_gym.sandbox.base import Sandbox, SandboxBackend
from harness_gym.sandbox.bwrap import bwrap_available
from harness_gym.sandbox.docker import docker_unavailable
from support.parallel import in_threads
from support.task_sandboxes import task_sandbox

# Tasks built to misbehave: tests/fixtures/tasks/<id>/ (task.json + repo/, diffs made with git).
FIXTURES = {t.instance_id: t for t in load_tasks(Path(__file__).parents[1] / "fixtures" / "tasks")}
CALC = FIXTURES["fixture__calc-6"]  # F2P in tests/test_core.py; P2P also in tests/test_other.py
UNITTEST = FIXTURES["fixture__unittest-3"]  # python -m unittest -v, log_parser "unittest"
KVCONF = {t.instance_id: t for t in load_tasks("builtin")}["harness-gym__kvconf-23"]
F2P = CALC.FAIL_TO_PASS[0]



@functools.cache
def unavailable(name: str) -> str | None:
    """Why the backend `name` cannot run here, or None (probed once, when first asked)."""
    if name == "bwrap":
        return None if bwrap_available() else "bubblewrap cannot run here"
    return docker_unavailable() if name == "docker" else None

Agent = Callable[[Sandbox], None]


def backend_params(*names: str) -> list[Any]:
    """`names` as parameters of a test, each skipped (with the reason) where it cannot run."""
    return [pytest.param(n, id=n, marks=pytest.mark.skipif(unavailable(n) is not None,
                                                          reason=str(unavailable(n))))
            for n in names]  # fmt: skip


def skip_if_unavailable(name: str) -> None:
    if unavailable(name):
        pytest.skip(unavailable(name))


def open_backend(name: str) -> Iterator[SandboxBackend]:
    """A fixture's body (`yield from open_backend(request.param)`): the backend `name`, the
    test skipped where it cannot run, closed after. (The fixtures stay in the test modules: an
    imported fixture reads as an unused import.)"""
    skip_if_unavailable(name)
    backend = load_sandbox(name)
    yield backend
    backend.close()


def run_agent(backend: SandboxBackend, task: Task, scratch: Path, *moves: Agent,
              label: str = "attack", **spec: Any) -> GradeResult:
    """A fresh sandbox of `task` (its repo in `scratch`/repo; `spec`: more SandboxSpec fields),
    the agent's moves, then the grader."""
    with task_sandbox(task, scratch, backend, repo_name="repo", label=label, **spec) as sandbox:
        for move in moves:
            move(sandbox)
        return grade(task, sandbox, timeout_s=180)


def grade_cases(backend_name: str, cases: list[str],
                grade_one: Callable[[SandboxBackend, str], GradeResult]) -> dict[str, GradeResult]:
    """`grade_one(backend, case)` for every case, three sandboxes at a time, each thread on a
    backend of its own (closed after)."""

    def work(share: list[str]) -> list[GradeResult]:
        backend = load_sandbox(backend_name)
        try:
            return [grade_one(backend, case) for case in share]
        finally:
            backend.close()

    return dict(zip(cases, in_threads(work, cases, 3)))


def write(path: str, text: str) -> Agent:
    return lambda sandbox: sandbox.write_file(f"{sandbox.workdir}/{path}", text)


def shell(command: str) -> Agent:
    def move(sandbox: Sandbox) -> None:
        result = sandbox.exec(command, cwd=sandbox.workdir)
        assert result.exit_code == 0, result.stderr

    return move


def gold(task: Task) -> Agent:
    return lambda sandbox: apply_patch(sandbox, task.patch)


def assert_failed(result: GradeResult, reason: str, *, says: str = "") -> None:
    """The verdict is a failure (the reward a failure gets), for `reason`, and says `says`."""
    assert result.outcome == "failed", (result.reason, result.error, result.test_output[-2000:])
    assert RewardConfig()(result.outcome, 0)[0] == RewardConfig().failure
    assert result.reason == reason, (result.reason, result.error, result.test_output[-2000:])
    if says:
        assert says in (result.error or "") + " ".join(result.notes), (result.error, result.notes)


# The start of a forged-output payload (code under test, imported by the tests): it gets past
# pytest's output capture, finding the capture manager by a frame walk up to pytest's config
# (gc walks are refused by the grader's audit hook).
PAST_THE_CAPTURE = '''
import os, sys
_frame, _capman = sys._getframe(), None
while _frame is not None and _capman is None:
    _config = _frame.f_locals.get("config") or getattr(_frame.f_locals.get("self"), "config", None)
    if hasattr(_config, "pluginmanager"):
        _capman = _config.pluginmanager.getplugin("capturemanager")
    _frame = _frame.f_back
_capman.suspend_global_capture(in_=True)
'''
