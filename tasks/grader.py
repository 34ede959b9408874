"""Grading a rollout with SWE-bench semantics, through the `Sandbox` seam only.

The candidate is whatever the agent left in `sandbox.workdir`. `grade`:

1. captures the agent's patch: everything changed since `base_commit`, untracked files included
   (`git add -A; git diff --cached --binary base_commit`), even if the agent committed. An agent
   that deleted or replaced `.git` broke its own repo, not our infrastructure: for a directory
   task the base commit is rebuilt from the task's `repo/` (same hash, see `materialize`) and the
   agent's files are graded against it, with a note; a dataset row's base cannot be rebuilt
   outside its image, so that rollout is `failed` with an error saying why;
2. resets every file the task's `test_patch` touches to `base_commit` (and deletes the ones the
   test patch creates), so an agent that edited or wrote the judging tests gains nothing;
3. applies `test_patch`, runs `install_config.test_cmd` under a timeout, parses the log;
4. passes only if every FAIL_TO_PASS test is PASSED or XFAIL and every PASS_TO_PASS test is
   PASSED, XFAIL or SKIPPED. A test missing from the log is a failure, so an empty parse (a
   crash, a collection error, a parser mismatch) never passes. With `exact_test_set` (task
   `install_config` key, or `grade(..., exact_test_set=True)`) no other test in the log may fail
   either: our reading of SWE-rebench V2's stricter mode, where the run must show exactly the
   F2P and P2P tests passing; tests the agent added may pass but may not fail.

The log is output the agent's code can write to. Two defences against printed fake results:
a pytest log's PASSED lines must not outnumber what pytest's own closing summary line counts
(and with no summary at all, pytest did not finish, so no line is trusted); and a task may set
`install_config.junit_xml = "auto"` (with `log_parser: "junit"`), which makes pytest write a
JUnit report (through `PYTEST_ADDOPTS`) to a random path in the sandbox's HOME, outside the work
tree, named only when the tests start, and grades from that report alone, never from stdout.
(Code running inside that pytest session can still read the variable: this defends against
printed output and planted files, not against a conftest that rewrites pytest's own reports.)

Timeouts and broken infrastructure (git unusable, test patch not applying, sandbox down) are
reported as `timeout` and `infra_error`, never as a plain `failed`.
"""

from __future__ import annotations

import fnmatch
import io
import posixpath
import secrets
import shlex
import tarfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..sandbox.base import ExecResult, Sandbox, SandboxError

from .diffs import paths_touched_by
from .loader import BASE_COMMIT_IDENTITY, BUILD_LITTER, GIT_EXCLUDES, GIT_ISOLATION
from .log_parsers import PYTEST_LOG_PARSERS, TestStatus, get_log_parser, pytest_session_totals
from .task import Task

__all__ = [
    "GradeResult",
    "GroupCounts",
    "Outcome",
    "PatchApplyError",
    "RepositoryLostError",
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


class RepositoryLostError(RuntimeError):
    """The agent deleted or replaced the sandbox's git repository and it cannot be rebuilt."""


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
    error: str | None = None  # why, for timeout and infra_error (and a failed untrusted log)
    notes: list[str] = field(default_factory=list)  # what the grader had to repair first

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

    Grading rewrites the tree (test files reset, test patch applied, the index staged): grade a
    sandbox once, after the agent is done. `timeout_s` bounds the test command only.
    `exact_test_set` overrides the task's `install_config.exact_test_set` (see the module doc).
    """
    started = time.monotonic()
    base = task.base_commit or "HEAD"
    patch = ""
    notes: list[str] = []
    if exact_test_set is None:
        exact_test_set = bool(task.install_config.get("exact_test_set", False))

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
            notes=notes,
        )

    try:
        if note := _ensure_base_commit(task, sandbox, base):
            notes.append(note)
        patch = capture_patch(sandbox, base)
        _reset_test_files(sandbox, base, paths_touched_by(task.test_patch))
        apply_patch(sandbox, task.test_patch, allow_fuzz=False)
    except PatchApplyError as error:
        return finish("infra_error", error=f"test_patch did not apply: {error}")
    except RepositoryLostError as error:
        return finish("failed", error=str(error))
    except (SandboxGitError, SandboxError) as error:
        return finish("infra_error", error=str(error))

    try:
        run = _run_tests(task, sandbox, timeout_s)
    except SandboxError as error:
        return finish("infra_error", error=f"the test command could not run: {error}")
    try:
        tests = get_log_parser(task.log_parser)(run.parser_input)
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
    outcome, f2p, p2p, failing = judge_tests(task, tests, exact_test_set=exact_test_set)
    untrusted = _untrusted_log(task, run, tests)
    return finish(
        "failed" if untrusted else outcome,
        error=untrusted,
        tests=tests,
        test_output=output_tail,
        f2p=f2p,
        p2p=p2p,
        failing=failing,
    )


def judge_tests(
    task: Task, tests: dict[str, TestStatus], *, exact_test_set: bool = False
) -> tuple[Outcome, GroupCounts, GroupCounts, list[str]]:
    """SWE-bench's verdict on parsed statuses: (outcome, f2p, p2p, failing tests). With
    `exact_test_set`, any other reported test that FAILED or ERRORed is failing too."""
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


def _untrusted_log(task: Task, run: _TestRun, tests: dict[str, TestStatus]) -> str | None:
    """Why a pytest log's report lines cannot be believed, or None.

    Code under test (a conftest, a patched module) can print `PASSED tests/t.py::test_x` and
    then crash or `os._exit`; pytest's closing `N passed in Xs` line is printed only by a
    session that finished, and counts what really ran.
    """
    if task.log_parser not in PYTEST_LOG_PARSERS or task.install_config.get("junit_xml"):
        return None
    claimed = sum(status == TestStatus.PASSED for status in tests.values())
    if not claimed:
        return None
    totals = pytest_session_totals(run.log)
    if totals is None:
        return (
            f"untrusted test log: {claimed} test(s) reported PASSED but pytest printed no session "
            f"summary (exit {run.result.exit_code}): pytest did not finish, so those lines may "
            "have been printed by the code under test"
        )
    if claimed > totals.get("passed", 0):
        return (
            f"untrusted test log: {claimed} test(s) reported PASSED but pytest's summary counts "
            f"{totals.get('passed', 0)} passed: the code under test printed some of those lines"
        )
    return None


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


def _ensure_base_commit(task: Task, sandbox: Sandbox, base: str) -> str | None:
    """Make sure the work dir is a git repo holding `base`; rebuild it from the task's source
    tree if the agent deleted or replaced `.git`. Returns a note when it rebuilt."""
    probe = sandbox.exec(
        ["git", "cat-file", "-e", f"{base}^{{commit}}"],
        cwd=sandbox.workdir,
        env=_git_env(sandbox),
        timeout=GIT_TIMEOUT_S,
    )
    if _succeeded(probe):
        return None
    if probe.exit_code == 127 or probe.timed_out:  # no git in the sandbox, or it hung
        raise SandboxGitError(f"git cannot run in the sandbox {_explain(probe)}")
    lost = f"the work dir has no git repository holding base commit {base} (was .git deleted?)"
    if task.repo_dir is None or not task.base_commit:
        raise RepositoryLostError(
            f"{lost}; task {task.instance_id!r} is a dataset row whose base commit exists only in "
            "its image, so the agent's changes cannot be told apart from the original code"
        )
    _rebuild_base_commit(task, sandbox)
    return f"{lost}: rebuilt it from the task's repo/ and graded the agent's files against it"


def _source_tarball(task: Task) -> bytes:
    """The task's `repo/` as a tar, without the build litter `materialize` also leaves out."""
    assert task.repo_dir is not None
    buffer = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = posixpath.basename(info.name)
        return None if any(fnmatch.fnmatch(name, p) for p in BUILD_LITTER) else info

    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(task.repo_dir.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buffer.getvalue()


def _rebuild_base_commit(task: Task, sandbox: Sandbox) -> None:
    """Commit the task's source tree into a fresh `.git` (a side work tree, so the agent's files
    stay as they are), then point the index at it. The identity and dates are `materialize`'s,
    so the commit gets the task's `base_commit` hash; anything else is refused."""
    # In HOME, like the JUnit report: some backends give every exec a fresh /tmp.
    tmp = posixpath.join(sandbox.home, f".harness-gym-base-{secrets.token_hex(8)}")
    scratch = sandbox.exec(["mkdir", "-p", "--", tmp], timeout=GIT_TIMEOUT_S)
    if not _succeeded(scratch):
        raise SandboxGitError(f"could not make a scratch dir in the sandbox {_explain(scratch)}")
    sandbox.write_file(f"{tmp}/base.tar", _source_tarball(task))
    git = "git -c core.autocrlf=false -c commit.gpgsign=false"
    message = shlex.quote(BASE_COMMIT_IDENTITY.message)
    script = "\n".join(
        [
            "set -e",
            f"mkdir {shlex.quote(tmp)}/tree",
            f"tar -xf {shlex.quote(tmp)}/base.tar -C {shlex.quote(tmp)}/tree",
            "rm -rf .git",
            f"{git} init -q --initial-branch=main",
            f"{git} --work-tree={shlex.quote(tmp)}/tree add --all --force",
            f"{git} commit -q --no-verify --allow-empty -m {message}",
            f"printf %s {shlex.quote(GIT_EXCLUDES)} > .git/info/exclude",
            f"{git} reset -q",
            f"rm -rf {shlex.quote(tmp)}",
            "git rev-parse HEAD",
        ]
    )
    env = {**_git_env(sandbox), **GIT_ISOLATION, **BASE_COMMIT_IDENTITY.git_env()}
    result = sandbox.exec(script, cwd=sandbox.workdir, env=env, timeout=GIT_TIMEOUT_S)
    if not _succeeded(result):
        raise SandboxGitError(f"could not rebuild the base commit {_explain(result)}")
    if (rebuilt := result.stdout.strip().splitlines()[-1]) != task.base_commit:
        raise SandboxGitError(
            f"rebuilt the base commit as {rebuilt}, not {task.base_commit}: the sandbox's git "
            "commits the task's files differently"
        )


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
    patches whose context drifted (dry-run first: `patch` would otherwise leave the hunks that
    fit applied and the rest in `.rej` files). Raises `PatchApplyError` with both tools'
    messages; a malformed or truncated diff is one of those, never another exception.
    """
    if not isinstance(diff, str):
        raise PatchApplyError(f"a diff must be text, got {type(diff).__name__}")
    if not diff.strip():
        return
    data = diff.encode("utf-8", errors="surrogateescape")
    if not data.endswith(b"\n"):
        data += b"\n"  # a diff cut at its last line reads as "corrupt patch"
    fuzzy = ["patch", "--batch", "--forward", "--fuzz=5", "-p1"]
    attempts = [[["git", "apply", "--verbose", "--whitespace=nowarn", "-"]]]
    if allow_fuzz:
        attempts.append([[*fuzzy, "--dry-run"], fuzzy])
    messages = []
    for steps in attempts:
        for command in steps:
            result = sandbox.exec(
                command, cwd=sandbox.workdir, env=_git_env(sandbox), timeout=timeout_s, stdin=data
            )
            if not _succeeded(result):
                messages.append(f"{' '.join(command[:2])} {_explain(result)}")
                break
        else:
            return
    if "\n@@ " not in diff and "GIT binary patch" not in diff:
        first_line = diff.lstrip().splitlines()[0][:80]
        messages.append(f"it has no hunks, so it is not a unified diff (it starts {first_line!r})")
    raise PatchApplyError("\n".join(messages))


# --- the test run -------------------------------------------------------------------------------


@dataclass
class _TestRun:
    result: ExecResult
    log: str  # stdout, then stderr
    junit: bool = False  # the task names a JUnit report: statuses come from it alone
    report: str | None = None  # that report (None: none was written)

    @property
    def parser_input(self) -> str:
        """The report when the task has one: stdout is the agent's code talking."""
        return (self.report or "") if self.junit else self.log


def _run_tests(task: Task, sandbox: Sandbox, timeout_s: float) -> _TestRun:
    junit_xml = task.install_config.get("junit_xml")
    command, env = task.test_cmd, dict(_TEST_ENV)
    if junit_xml == "auto":
        # Named now, outside the work tree: nothing the agent left behind can be at this path.
        # In HOME, not /tmp: some backends give every exec a fresh /tmp (bwrap's tmpfs).
        junit_xml = posixpath.join(sandbox.home, f".harness-gym-junit-{secrets.token_hex(16)}.xml")
        env["PYTEST_ADDOPTS"] = f"--junitxml={junit_xml} -o junit_family=xunit1"
    if junit_xml:
        # A report left behind (or planted by the agent) must not be read as this run's result.
        command = f"rm -f -- {shlex.quote(junit_xml)}\n{command}"
    result = sandbox.exec(command, cwd=sandbox.workdir, env=env, timeout=timeout_s)
    run = _TestRun(result, result.stdout + ("\n" + result.stderr if result.stderr else ""))
    if junit_xml:
        run.junit = True
        # Read through exec, like everything else, so every backend behaves the same.
        quoted = shlex.quote(junit_xml)
        report = sandbox.exec(
            f"cat -- {quoted} && rm -f -- {quoted}", cwd=sandbox.workdir, timeout=GIT_TIMEOUT_S
        )
        if report.exit_code == 0 and not result.timed_out:
            run.report = report.stdout  # no report: the tests stay missing, failing the grade
    return run
