"""The grader's steps inside the sandbox, after the agent is done: three sandbox commands.

1. `survey`: checks the base commit is there, then reports the agent's patch, the base commit's
   file list (dataset rows; a directory task's comes from its `repo/` on the host, which the
   agent never touched), every path in the work tree, the shared config files the agent edited
   (both versions, to compare what pytest reads from them) and pytest configuration or conftest
   files planted in the directories above the work tree.
2. `run_tests` (the kit, built by `prepare` on the host, streamed in as a tar): makes a fresh
   grader directory in HOME holding the in-sandbox package (`sandbox_grading`), one-time keys and
   the restore plan (`test_scope.plan_restore`); removes, restores and re-hashes the test scope
   (a restored file whose bytes do not hash to the base blob means the repository's object store
   was doctored); applies the test patch; hashes what it touched; then runs the task's test
   command with grader-owned settings: plugin autoload off, PYTEST_ADDOPTS/PYTEST_PLUGINS set by
   us (`-p no:cacheprovider`, the grader's plugin), the user site off, the grader's directory
   first on PYTHONPATH.
3. `collect`: the preparation's results, the channel, a JUnit report if the task has one; then
   the grader directory is removed.

`verify_report` then holds what the runner loaded against the task's own files.
"""

from __future__ import annotations

import functools
import hashlib
import io
import posixpath
import secrets
import shlex
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..sandbox.base import ExecResult, Sandbox, SandboxError

from . import sandbox_grading
from .diffs import paths_touched_by
from .git_hash import tree_entries
from .grading_report import RunnerReport
from .loader import BUILD_LITTER
from .log_parsers import PYTEST_LOG_PARSERS
from .sandbox_git import (
    GIT_PRELUDE,
    GIT_TIMEOUT_S,
    PatchApplyError,
    SandboxGitError,
    capture_script,
    explain,
    run_git_script,
    succeeded,
)
from .task import Task
from .test_scope import (
    SHARED_CONFIG_NAMES,
    BaseEntry,
    RestorePlan,
    in_test_scope,
    plan_restore,
    runner_config_section,
)

__all__ = [
    "BaseCommitMissing",
    "Prepared",
    "Survey",
    "TestRun",
    "collect",
    "origin_problems",
    "tracer_problems",
    "prepare",
    "run_tests",
    "runner_kind",
    "survey",
    "verify_report",
]

UNITTEST_LOG_PARSERS = frozenset({"unittest", "django", "parse_log_django"})
# Pytest configuration files the survey looks for above the work tree (see `survey`).
_ABOVE_TREE = ("conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml")
_ABOVE_TREE_IF_PYTEST = ("pyproject.toml", "tox.ini", "setup.cfg")
_SANDBOX_DIR = Path(sandbox_grading.__file__).parent


def runner_kind(task: Task) -> str | None:
    """Which in-sandbox reporter grades the task: "pytest" (the plugin must report), "unittest"
    (the hooks must report), "junit" (a JUnit report the task names: the plugin reports when
    pytest wrote it; another tool's report is read alone), None (a registered log parser for a
    framework the grader has no reporter for: the log is all there is)."""
    if task.log_parser in PYTEST_LOG_PARSERS or task.install_config.get("junit_xml") == "auto":
        return "pytest"
    if task.log_parser in UNITTEST_LOG_PARSERS:
        return "unittest"
    if task.log_parser == "junit":
        return "junit"
    return None


def _split_any(text: str, boundary: str) -> list[str]:
    pieces = ("\n" + text).split("\n" + boundary + "\n")
    pieces[0] = pieces[0][1:]
    return pieces


def _split(text: str, boundary: str, parts: int) -> list[str]:
    pieces = _split_any(text, boundary)
    if len(pieces) != parts:
        raise SandboxGitError(f"a grader script's output has {len(pieces)} sections, not {parts}")
    return pieces


# --- 1. survey -----------------------------------------------------------------------------------


@dataclass
class Survey:
    patch: str
    base: dict[str, BaseEntry]
    disk: dict[str, str]  # path -> find's type letter
    planted_above: list[str]  # pytest configuration in directories above the work tree
    # shared configuration files the agent edited whose test sections are still the task's
    kept_configs: dict[str, str] = field(default_factory=dict)  # path -> blob id of the edit


BASE_MISSING = 3  # the survey's exit status when the repository lacks the base commit


class BaseCommitMissing(Exception):
    """The work dir's repository lacks the base commit (or `.git` is gone): see
    `ensure_base_commit`."""


@functools.lru_cache(maxsize=64)
def _host_base(repo_dir: Path, base_commit: str) -> dict[str, BaseEntry]:
    """A directory task's base files, from its repo/ (cached per task: it does not change)."""
    return {p: BaseEntry(*e) for p, e in tree_entries(repo_dir, BUILD_LITTER).items()}


def survey(task: Task, sandbox: Sandbox, base: str) -> Survey:
    boundary = secrets.token_hex(16)
    from_host = task.repo_dir is not None and bool(task.base_commit)
    above = " ".join(_ABOVE_TREE + _ABOVE_TREE_IF_PYTEST)
    grep_names = "|".join(_ABOVE_TREE_IF_PYTEST)
    shared = " ".join(f"'*{name}'" for name in sorted(SHARED_CONFIG_NAMES))
    script = "\n".join(
        [
            "command -v git >/dev/null || exit 127",
            f"[ -d .git ] && [ ! -L .git ] && git cat-file -e {shlex.quote(base)}^{{commit}} "
            f"2>/dev/null || exit {BASE_MISSING}",
            capture_script(base, then="\n".join([
                f"printf '\\n%s\\n' {boundary}",
                # Shared config files the agent changed: the task's text and the agent's.
                f"git diff --cached --name-only -z {shlex.quote(base)} -- {shared} | "
                "while IFS= read -r -d '' p; do",
                f'  printf "%s\\n%s\\n" "$p" {boundary}; git cat-file blob {shlex.quote(base)}:"$p"',
                f'  printf "\\n%s\\n" {boundary}; cat -- "$p"; printf "\\n%s\\n" {boundary}',
                "done",
            ])),  # fmt: skip
            f"printf '\\n%s\\n' {boundary}",
            "" if from_host else f"git ls-tree -r -z --full-tree {shlex.quote(base)} || exit 83",
            f"printf '\\n%s\\n' {boundary}",
            "find . -mindepth 1 -path ./.git -prune -o -printf '%y %P\\0' || exit 84",
            f"printf '\\n%s\\n' {boundary}",
            'd=$PWD; while [ "$d" != / ] && [ -n "$d" ]; do d=$(dirname "$d")',
            f"  for n in {above}; do f=${{d%/}}/$n; [ -f \"$f\" ] || continue",
            f'    case $n in {grep_names}) grep -q pytest "$f" 2>/dev/null || continue;; esac',
            "    printf '%s\\0' \"$f\"; done; done",
        ]
    )
    result = run_git_script(sandbox, script)
    if result.exit_code == BASE_MISSING and not result.timed_out:
        raise BaseCommitMissing(base)
    if not succeeded(result):
        raise SandboxGitError(f"could not survey the work tree {explain(result)}")
    pieces = _split_any(result.stdout, boundary)
    if len(pieces) < 5 or (len(pieces) - 5) % 3:
        raise SandboxGitError(f"the survey's output has {len(pieces)} sections")
    patch, configs, (tree, listing, above_found) = pieces[0], pieces[1:-3], pieces[-3:]
    if from_host:
        assert task.repo_dir is not None
        base_files = _host_base(task.repo_dir, task.base_commit)
    else:
        base_files = {}
        for record in tree.strip("\n").split("\0"):
            if "\t" in record:
                meta, path = record.split("\t", 1)
                mode, _kind, blob = meta.split()
                base_files[path] = BaseEntry(mode, blob)
    disk = {}
    for record in listing.strip("\n").split("\0"):
        if len(record) > 2 and record[1] == " ":
            disk[record[2:]] = record[0]
    planted = [p for p in above_found.strip("\n").split("\0") if p]
    found = Survey(patch, base_files, disk, planted)
    for index in range(0, len(configs) - 1, 3):
        path, theirs, ours = configs[index].strip("\n"), configs[index + 1], configs[index + 2]
        name = path.rsplit("/", 1)[-1]
        genuine = path in base_files and _blob_id(theirs.encode()) == base_files[path].blob
        if genuine and runner_config_section(name, theirs) == runner_config_section(name, ours):
            found.kept_configs[path] = _blob_id(ours.encode("utf-8", "surrogateescape"))
    return found


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# --- 2. prepare ----------------------------------------------------------------------------------


@dataclass
class Prepared:
    grader_dir: str
    keys: dict[int, bytes]
    plan: RestorePlan
    touched: frozenset[str]
    expected: dict[str, str]  # path -> blob id the tests must see (base, or after the test patch)
    swept: list[str] = field(default_factory=list)  # unignored files the agent added to test dirs
    doctored: list[str] = field(default_factory=list)  # restored files whose bytes are not the base's
    base: str = "HEAD"
    kit: bytes = b""  # the tar `run_tests` unpacks into the grader directory


def _kit(task: Task, plan: RestorePlan, keys: dict[int, bytes], touched: list[str]) -> bytes:
    buffer = io.BytesIO()

    def add(name: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))

    def paths(items: list[str]) -> bytes:
        return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in items)

    with tarfile.open(fileobj=buffer, mode="w") as tar:
        package = f"lib/{sandbox_grading.SANDBOX_PACKAGE}"
        for source in sorted(_SANDBOX_DIR.glob("*.py")):
            if source.name == "sitecustomize.py":
                if runner_kind(task) == "unittest":
                    add("lib/sitecustomize.py", source.read_bytes())
                continue
            add(f"{package}/{source.name}", source.read_bytes())
        for number, key in keys.items():
            add(f"keys/{number}", key, 0o600)
        add("plan/remove", paths(plan.remove))
        add("plan/steering", paths(plan.steering))
        add("plan/dirs", paths(plan.directories))
        add("plan/restore", paths(plan.restore))
        add("plan/verify", paths(list(plan.verify)))
        add("plan/patched", paths(touched))
        add("test.patch", task.test_patch.encode("utf-8", "surrogateescape"))
    return buffer.getvalue()


# The prepare steps write only to files in the grader directory: the command's output is the
# test run's. Status in prepare.rc: 0, or the step that failed (98: the test patch).
_PREPARE = r"""
export GIT_INDEX_FILE="$GD/index"
git read-tree "$BASE" || exit 92
xargs -0 -r rm -rf -- < "$GD/plan/remove" || exit 93
git checkout-index -f -z --stdin < "$GD/plan/steering" || exit 94
: > "$GD/out/swept"
if [ -s "$GD/plan/dirs" ]; then
  xargs -0 git ls-files -z --others --exclude-per-directory=.gitignore -- \
    < "$GD/plan/dirs" > "$GD/out/swept" || exit 95
  xargs -0 -r rm -f -- < "$GD/out/swept"
fi
git checkout-index -f -z --stdin < "$GD/plan/restore" || exit 96
: > "$GD/out/hashes"
if [ -s "$GD/plan/verify" ]; then
  tr '\0' '\n' < "$GD/plan/verify" | git hash-object --no-filters --stdin-paths \
    > "$GD/out/hashes" || exit 97
fi
if [ -s "$GD/test.patch" ]; then
  git apply --verbose --whitespace=nowarn "$GD/test.patch" || exit 98
fi
while IFS= read -r -d '' p; do
  if [ -f "$p" ] && [ ! -L "$p" ]; then printf '%s\t' "$p"; git hash-object --no-filters -- "$p"; fi
done < "$GD/plan/patched" > "$GD/out/patched"
rm -f "$GD/index"
"""


def prepare(task: Task, sandbox: Sandbox, base: str, found: Survey) -> Prepared:
    """Plan the restore and pack the kit (no sandbox command yet: `run_tests` runs the steps
    right before the tests, in the same command)."""
    touched = paths_touched_by(task.test_patch)
    plan = plan_restore(found.base, found.disk, touched, keep=found.kept_configs)
    keys = {n: secrets.token_hex(32).encode() for n in range(sandbox_grading.KEY_COUNT)}
    grader_dir = posixpath.join(sandbox.home, f".harness-gym-grader-{secrets.token_hex(12)}")
    prepared = Prepared(grader_dir, keys, plan, frozenset(touched), {}, base=base)
    prepared.kit = _kit(task, plan, keys, touched)
    for path, blob in found.kept_configs.items():
        if path not in plan.verify:
            prepared.expected[path] = blob
    return prepared


def _read_prepared(prepared: Prepared, status: str, log: str, hashes: str, swept: str,
                   patched: str) -> None:  # fmt: skip
    """Take the prepare steps' results; raises `PatchApplyError` or `SandboxGitError`."""
    if status.strip() == "98":
        raise PatchApplyError(log.strip()[-3000:])
    if status.strip() != "0":
        raise SandboxGitError(
            f"could not restore the test files (step {status.strip() or '?'}): {log.strip()[-2000:]}"
        )
    got = hashes.split()
    if len(got) != len(prepared.plan.verify):
        raise SandboxGitError("the restored test files could not all be hashed")
    for (path, blob), now in zip(prepared.plan.verify.items(), got):
        prepared.expected[path] = blob
        if now != blob:
            prepared.doctored.append(path)
    after_patch = dict(line.rsplit("\t", 1) for line in patched.splitlines() if "\t" in line)
    for path in prepared.touched:  # what the test patch made of it; gone if it deleted the file
        if path in after_patch:
            prepared.expected[path] = after_patch[path].strip()
        else:
            prepared.expected.pop(path, None)
    prepared.swept = sorted(p for p in swept.strip("\n").split("\0") if p)


# --- 3. run --------------------------------------------------------------------------------------


@dataclass
class TestRun:
    result: ExecResult
    log: str  # stdout, then stderr
    channel: str = ""
    junit: str | None = None  # the JUnit report, when the task names one and it was written
    probe_failed: bool = False  # no runner session, and the runner cannot even be imported
    timed_out: bool = False  # the test command ran past the tests' timeout and was killed


def _run_script(task: Task, prepared: Prepared, timeout_s: float) -> str:
    addopts = f"-p no:cacheprovider -p {sandbox_grading.SANDBOX_PACKAGE}.pytest_plugin"
    junit_xml = task.install_config.get("junit_xml")
    lines = [
        "export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONNOUSERSITE=1",
        f"export PYTEST_PLUGINS={sandbox_grading.SANDBOX_PACKAGE}.entrypoints",
        "unset PYTEST_DEBUG PYTHONSTARTUP PYTHONINSPECT PYTHONHOME PYTHONPYCACHEPREFIX",
        f'export {sandbox_grading.ENV_KEYS}="$GD/keys" {sandbox_grading.ENV_CHANNEL}="$GD/channel"',
        f'export {sandbox_grading.ENV_WORKDIR}="$PWD"',
        'export PYTHONPATH="$GD/lib${PYTHONPATH:+:$PYTHONPATH}"',
        ': > "$GD/channel"',
    ]
    if junit_xml == "auto":
        addopts += ' --junitxml="$GD/junit.xml" -o junit_family=xunit1'
    elif junit_xml:
        # A report left behind (or planted by the agent) must not be read as this run's result.
        lines.append(f"rm -f -- {shlex.quote(junit_xml)}")
    lines.append(f'export PYTEST_ADDOPTS="{addopts}"')
    if runner_kind(task) == "unittest":
        lines.append(f"export {sandbox_grading.ENV_UNITTEST}=1")
    probe = (
        "for py in python python3; do command -v $py >/dev/null && $py -I -c 'import pytest' "
        ">/dev/null 2>&1 && exit 0; done; exit 1"
        if runner_kind(task) != "unittest"
        else "command -v python >/dev/null || command -v python3 >/dev/null"
    )
    # The test command alone is bounded by the tests' timeout (`timeout` kills its whole process
    # group); the probe runs only when the runner never reported: is it missing from the sandbox?
    run = [
        f"limit='timeout -s KILL {timeout_s:g}'; command -v timeout >/dev/null || limit=",
        f"started=$(date +%s); $limit bash -c {shlex.quote(task.test_cmd)}",
        f'rc=$?; [ $rc = 137 ] && [ $(( $(date +%s) - started )) -ge {int(timeout_s)} ] '
        '&& : > "$GD/timed-out"',
        f'[ -s "$GD/channel" ] || ( {probe} ) || : > "$GD/no-runner"',
        "exit $rc",
    ]
    return "\n".join([*lines, *run])


_PREPARE_BUDGET_S = 120.0  # on top of the tests' timeout, for the restore steps before them


def run_tests(task: Task, sandbox: Sandbox, prepared: Prepared, timeout_s: float) -> TestRun:
    """Unpack the kit, restore the test scope, apply the test patch (in a subshell, with git's
    prelude), then run the test command with the grader's settings."""
    script = "\n".join(
        [
            f"GD={shlex.quote(prepared.grader_dir)} BASE={shlex.quote(prepared.base)}",
            'mkdir -m 700 -- "$GD" && tar -x -f - -C "$GD" && mkdir "$GD/out" || exit 90',
            'chmod -R a-w "$GD/lib"',
            f"( {GIT_PRELUDE}\n{_PREPARE} ) > \"$GD/out/log\" 2>&1",
            'echo $? > "$GD/out/rc"',
            '[ "$(cat "$GD/out/rc")" = 0 ] || exit 0',
            _run_script(task, prepared, timeout_s),
        ]
    )
    result = sandbox.exec(
        script, cwd=sandbox.workdir, timeout=timeout_s + _PREPARE_BUDGET_S, stdin=prepared.kit
    )
    return TestRun(result, result.stdout + ("\n" + result.stderr if result.stderr else ""))


def collect(task: Task, sandbox: Sandbox, prepared: Prepared, run: TestRun) -> None:
    """Read the prepare steps' results, the channel and a JUnit report, then remove the grader
    directory. Raises `PatchApplyError` or `SandboxGitError` when the preparation failed."""
    boundary = secrets.token_hex(16)
    junit_xml = task.install_config.get("junit_xml")
    report = '"$GD/junit.xml"' if junit_xml == "auto" else shlex.quote(junit_xml or "/dev/null")
    parts = [
        'cat "$GD/out/rc"',
        'cat "$GD/out/log"',
        'cat "$GD/out/hashes"',
        'cat "$GD/out/swept"',
        'cat "$GD/out/patched"',
        'cat "$GD/channel"',
        f"if [ -f {report} ]; then printf 1; cat {report}; fi",
        '[ -e "$GD/no-runner" ] && printf 1',
        '[ -e "$GD/timed-out" ] && printf 1',
    ]
    script = "\n".join(
        [
            f"GD={shlex.quote(prepared.grader_dir)}",
            *(f"{part} 2>/dev/null; printf '\\n%s\\n' {boundary}" for part in parts),
            'chmod -R u+w "$GD" 2>/dev/null; rm -rf -- "$GD"; true',
        ]
    )
    result = sandbox.exec(script, cwd=sandbox.workdir, timeout=GIT_TIMEOUT_S)
    if result.exit_code != 0 or result.timed_out:
        raise SandboxError(f"could not read the grader's report {explain(result)}")
    rc, log, hashes, swept, patched, channel, junit, probe, late, _ = _split(
        result.stdout, boundary, 10
    )
    run.timed_out = run.result.timed_out or late.startswith("1")
    if rc.strip() or not run.result.timed_out:  # a timeout while preparing: the caller says so
        if rc.strip() == "":
            raise SandboxGitError(f"the grader could not set up the test run {explain(run.result)}")
        _read_prepared(prepared, rc, log, hashes, swept, patched)
    run.channel = channel
    if junit.startswith("1") and not run.timed_out:
        run.junit = junit[1:]
    run.probe_failed = probe.startswith("1")


# --- verification --------------------------------------------------------------------------------


def verify_report(report: RunnerReport, prepared: Prepared, found: Survey) -> list[str]:
    """What the runner loaded that is not the task's: a configuration file outside the work tree
    or changed; from the work tree, a conftest, a plugin registered during collection (by code
    the tests imported) or a file implementing an outcome-deciding hook that is not the task's;
    a collected test module that differs from the task's; the runner itself loaded from the work
    tree. A plugin the task's own configuration names before collection (`pytest_plugins` of the
    root conftest) may be library code the fix changes: it is watched, not compared. Returns
    messages (empty: all loaded files are the task's)."""
    problems = []
    for rootdir in report.rootdirs:
        if rootdir.startswith("/") or rootdir == ".." or rootdir.startswith("../"):
            problems.append(f"pytest's rootdir is {rootdir}, outside the work tree")
    for item in report.loaded:
        expected = prepared.expected.get(item.path)
        if expected is None and item.path in found.base and item.path not in prepared.touched:
            expected = found.base[item.path].blob
        what = f"{item.kind} {item.path}" + (f" ({item.detail})" if item.detail else "")
        if item.kind == "runner":
            if item.in_tree and item.path not in found.base:
                problems.append(f"the test runner was loaded from the work tree: {item.path}")
            continue
        if not item.in_tree:
            if item.kind == "inifile":
                problems.append(f"pytest read its configuration from {item.path}, outside the tree")
            continue
        conftest = item.path.rsplit("/", 1)[-1] == "conftest.py"
        if item.kind == "plugin" and not conftest:
            continue
        if expected is None:
            if item.kind != "module":  # a test module the agent added outside the test scope
                problems.append(f"{what} is not part of the task's repository")
        elif item.blob != expected:
            problems.append(f"{what} differs from the task's version of that file")
    return problems


def origin_problems(
    report: RunnerReport, judged: set[str], prepared: Prepared
) -> list[str]:
    """Judged tests whose skip/xfail was raised from the code under test (not from a test file
    or pytest): `pytest.xfail()` planted in the library."""
    directories = frozenset(prepared.plan.directories)
    problems = []
    for test, origin in sorted(report.origins.items()):
        path = origin.rsplit(":", 1)[0]
        if test not in judged or path.startswith("/"):
            continue
        if not in_test_scope(path, directories, prepared.touched):
            problems.append(f"{test} was skipped/xfailed by the code under test ({origin})")
    return problems


def tracer_problems(report: RunnerReport, prepared: Prepared) -> list[str]:
    """Trace or profile functions the code under test defined or installed (a tracer can make a
    test jump over its assertions); those of test files, conftests and installed tools
    (coverage) are the task's own business."""
    directories = frozenset(prepared.plan.directories)
    problems = []
    for path, line in report.tracers:
        if path.startswith("/") or in_test_scope(path, directories, prepared.touched):
            continue
        how = f"installed at {path}:{line}" if line is not None else f"defined in {path}"
        problems.append(f"a trace or profile function {how}, in the code under test")
    return sorted(set(problems))
