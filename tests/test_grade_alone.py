"""`grade()` called on its own (a caller's own harness loop, no episode) gives the episode's
guarantee: nothing the agent left running touches the tree while the grader works in it.

The agent's move: a fix that fixes nothing, and a process left running (its own session, double
forked, environment scrubbed where the backend can still find it) that waits for the grader,
then copies the real fix into the code under test every 10 ms while the tests run. `grade()`
must fail it; the control shows the same attack passes when the grader's kill is skipped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness_gym.tasks import GradeResult, Task, grade
from harness_gym.tasks.diffs import paths_touched_by

from harness_gym.sandbox import load_sandbox
from harness_gym.sandbox._cgroups import cgroup_parent
from harness_gym.sandbox._pidns import how as pid_namespace
from harness_gym.sandbox.base import Sandbox, SandboxBackend
from harness_gym.sandbox._processes import marked_pids
from support.as_user import run_as_user, why_not
from support.grading import CALC, open_backend
from support.task_sandboxes import task_sandbox

TOKEN_VAR = "ATTACK_TOKEN"


@pytest.fixture(scope="module", params=["local", "bwrap", "docker"])
def backend(request: pytest.FixtureRequest) -> Iterator[SandboxBackend]:
    yield from open_backend(request.param)


def leave_a_writer(sandbox: Sandbox, task: Task, token: str, scrub: bool) -> None:
    """The gold fix kept aside, the tree left unfixed, and a background command whose
    double-forked, setsid'ed child waits for the grader and then copies the fix in."""
    aside = f"{sandbox.home}/aside"
    test_file = next(p for p in paths_touched_by(task.test_patch) if p.endswith(".py"))
    sandbox.write_file(f"{aside}/fix.patch", task.patch)
    setup = sandbox.exec(
        f'git apply "{aside}/fix.patch" && mkdir -p "{aside}/fixed" && git diff --name-only | '
        f'xargs -I{{}} cp --parents {{}} "{aside}/fixed/" && git checkout -q -- . && '
        f'cp {test_file} "{aside}/orig"', cwd=sandbox.workdir)  # fmt: skip
    assert setup.exit_code == 0, setup.stderr
    started = f'! cmp -s {test_file} "{aside}/orig" || compgen -G "$HOME/.harness-gym-grader-*"'
    loop = (f'until {started} >/dev/null; do sleep 0.01; done; '
            f'while :; do cp -r "{aside}/fixed/." .; sleep 0.01; : {token}; done')  # fmt: skip
    scrubbed = f'env -i PATH="$PATH" HOME="$HOME" {TOKEN_VAR}={token}' if scrub else ""
    escape = f"( setsid -f {scrubbed} nohup bash -c '{loop}' >/dev/null 2>&1 </dev/null & )"
    # The command itself stays too (a harness still running when the caller grades).
    sandbox.start(f"{escape}; exec sleep 600", cwd=sandbox.workdir, env={TOKEN_VAR: token})


def alive(token: str) -> list[int]:
    return marked_pids(TOKEN_VAR, token)


def attack(backend: SandboxBackend, tmp_path: Path, *, skip_kill: bool) -> GradeResult:
    repo_name = f"repo-{uuid.uuid4().hex[:6]}"
    token = uuid.uuid4().hex
    # On local without a cgroup or a pid namespace a scrubbed environment escapes the marker
    # search: there the process keeps its markers (local.py's module doc says so).
    scrub = backend.name != "local" or cgroup_parent() is not None or pid_namespace() is not None
    with task_sandbox(CALC, tmp_path, backend, repo_name=repo_name, label="grade-alone") as sandbox:
        leave_a_writer(sandbox, CALC, token, scrub)
        if skip_kill:
            sandbox.quiesce = lambda: None  # type: ignore[method-assign]
        result = grade(CALC, sandbox, timeout_s=180)
        if not skip_kill and backend.name != "docker":  # docker's are in the container's pid ns
            assert alive(token) == []
    assert alive(token) == []  # close() ends it either way
    return result


def test_grade_alone_kills_a_process_the_agent_left_writing(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    result = attack(backend, tmp_path, skip_kill=False)
    assert result.outcome == "failed", (result.reason, result.error, result.test_output[-2000:])
    assert result.reason == "tests_failed" and result.patch == ""


def test_without_the_kill_in_grade_that_process_would_have_passed(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    """The control: with the grader's kill skipped, the same attack passes. It races pytest,
    so it gets three tries; one pass shows it is real."""
    outcomes = []
    for _ in range(3):
        outcomes.append(attack(backend, tmp_path, skip_kill=True).outcome)
        if outcomes[-1] == "passed":
            break
    assert "passed" in outcomes, outcomes


AS_USER = r"""
import json, os, sys, tempfile, warnings
from pathlib import Path
warnings.simplefilter("ignore")
sys.path.insert(0, TESTS)
import test_grade_alone as t
from harness_gym.sandbox import load_sandbox
from harness_gym.sandbox.bwrap import bwrap_available

out = {}
for name in ["local"] + (["bwrap"] if bwrap_available() else []):
    backend = load_sandbox(name)
    out[name] = t.attack(backend, Path(tempfile.mkdtemp()), skip_kill=False).outcome
    control = []
    for _ in range(3):  # it races pytest: one pass shows it is real
        control.append(t.attack(backend, Path(tempfile.mkdtemp()), skip_kill=True).outcome)
        if control[-1] == "passed":
            break
    out[name + "-control"] = control
    backend.close()
print(json.dumps(out))
"""


def test_grade_alone_as_a_non_root_user() -> None:
    """The same attack and control as a throwaway non-root user (no cgroup: RLIMIT_NPROC in a
    user namespace; on `local` the sandbox's pid namespace, made in a user namespace, finds the
    `env -i` + setsid escapee, where util-linux can make one)."""
    if why := why_not():
        pytest.skip(why)
    done = run_as_user(AS_USER.replace("TESTS", repr(str(Path(__file__).parent))), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("local", "bwrap"):
        if name in measured:
            assert measured[name] == "failed", measured
            assert "passed" in measured[name + "-control"], measured


def test_an_episode_does_not_pay_the_kill_twice(tmp_path: Path) -> None:
    """The episode kills once, before it reads the harness's output; grade() then kills only
    if a command ran since."""
    backend = load_sandbox("local")
    try:
        with task_sandbox(CALC, tmp_path, backend, repo_name="repo", label="rollout") as sandbox:
            kills = []
            kill = sandbox.kill_processes
            sandbox.kill_processes = lambda: (kills.append(1), kill())[1]  # type: ignore[method-assign]
            sandbox.start("sleep 60")
            sandbox.kill_processes()  # the episode's
            grade(CALC, sandbox, timeout_s=180)
            assert len(kills) == 1
            sandbox.exec("true")  # a command since: the next grade kills again
            grade(CALC, sandbox, timeout_s=180)
            assert len(kills) == 2
    finally:
        backend.close()
