"""The grader: SWE-bench semantics (only stricter) through the sandbox seam, against agents that
cheat, hang or leave odd trees; runs that end badly; other test frameworks; task validation.
The attack classes on bwrap and docker are in test_grader_attacks.py."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from harness_gym.tasks import (
    GradeResult,
    GroupCounts,
    PatchApplyError,
    TestStatus,
    apply_patch,
    grade,
    judge_tests,
    load_tasks,
    parse_unittest_log,
    pytest_session_totals,
    register_log_parser,
    validate_task,
)
from harness_gym.tasks.diffs import paths_touched_by
from harness_gym.tasks.log_parsers import _PARSERS
from support.grading import CALC, FIXTURES, KVCONF, PAST_THE_CAPTURE, UNITTEST
from support.task_sandboxes import PYTHON_PATH_ENV, read, task_sandbox, write

from harness_gym.sandbox.local import LocalSandboxBackend

TASKS = {task.instance_id: task for task in load_tasks("builtin")}
SPANS = TASKS["harness-gym__spans-14"]  # test_patch modifies tests/test_merge.py
# KVCONF: its test_patch creates tests/test_values.py. CALC: P2P tests in a file the test patch
# does not touch. UNITTEST: python -m unittest -v, log_parser "unittest".
HANG = FIXTURES["fixture__hang-1"]  # the unfixed code loops forever on the F2P test
FLAKY = FIXTURES["fixture__flaky-2"]  # eight P2P tests pass by a coin flip
BADPATCH = FIXTURES["fixture__badpatch-4"]  # its gold patch is cut off mid-hunk
JUNIT = FIXTURES["fixture__junit-5"]  # junit_xml "auto": graded from a report outside the tree


# --- agents that touch the judging tests --------------------------------------------------------


def test_an_agent_that_rewrites_the_f2p_tests_as_assert_true_still_fails(tmp_path: Path):
    with task_sandbox(SPANS, tmp_path) as sandbox:
        apply_patch(sandbox, SPANS.test_patch)  # the agent somehow knows the hidden tests...
        cheat = read(sandbox, "tests/test_merge.py")
        for line in (
            "assert merge([Interval(5, 8)",
            "assert total_length([Interval(5, 8)",
            "assert merge([intervals[i]",
        ):
            cheat = "\n".join(
                "    assert True" if row.strip().startswith(line) else row
                for row in cheat.splitlines()
            )
        write(sandbox, "tests/test_merge.py", cheat)  # ...and makes them pass trivially
        own_run = sandbox.exec("python -m pytest -p no:cacheprovider tests", cwd=sandbox.workdir)
        assert own_run.exit_code == 0, own_run.stdout  # the cheat works on the agent's tree
        result = grade(SPANS, sandbox, timeout_s=120)

    assert result.outcome == "failed"
    assert "+    assert True" in result.patch  # the cheat is on record in the agent's patch
    assert all(result.tests[test] == TestStatus.FAILED for test in SPANS.FAIL_TO_PASS)
    assert result.f2p == GroupCounts(total=7, passed=0, failed=7, missing=0)
    assert sorted(result.failing) == sorted(SPANS.FAIL_TO_PASS)


def test_an_agent_that_writes_the_test_file_the_test_patch_creates_still_fails(tmp_path: Path):
    fake_tests = "def test_value_may_contain_equals():\n    assert True\n"
    with task_sandbox(KVCONF, tmp_path) as sandbox:
        write(sandbox, "tests/test_values.py", fake_tests)
        result = grade(KVCONF, sandbox, timeout_s=120)
    # Not infra_error: the planted file is deleted, so the test patch applies cleanly.
    assert result.outcome == "failed", result.error
    assert result.tests["tests/test_values.py::test_value_may_contain_equals"] == TestStatus.FAILED


def test_an_agent_that_commits_its_fix_is_graded_on_the_tree_and_diffed_against_base(
    tmp_path: Path,
):
    with task_sandbox(KVCONF, tmp_path) as sandbox:
        apply_patch(sandbox, KVCONF.patch)
        committed = sandbox.exec(
            "git add -A && git -c user.name=agent -c user.email=a@b commit -qm fix",
            cwd=sandbox.workdir,
        )
        assert committed.exit_code == 0, committed.stderr
        result = grade(KVCONF, sandbox, timeout_s=120)
    assert result.outcome == "passed"
    assert paths_touched_by(result.patch) == ["kvconf/parser.py"]


def test_the_captured_patch_holds_new_and_binary_files_and_replays_to_a_pass(tmp_path: Path):
    binary = bytes(range(256)) * 4
    with task_sandbox(KVCONF, tmp_path / "agent") as sandbox:
        apply_patch(sandbox, KVCONF.patch)
        write(sandbox, "kvconf/notes.md", "why the parser changed\n")
        sandbox.write_file(f"{sandbox.workdir}/kvconf/blob.bin", binary)
        sandbox.exec("python -m pytest -q -p no:cacheprovider tests", cwd=sandbox.workdir)
        first = grade(KVCONF, sandbox, timeout_s=120)
    assert first.outcome == "passed"
    assert "GIT binary patch" in first.patch
    assert sorted(paths_touched_by(first.patch)) == [
        "kvconf/blob.bin",
        "kvconf/notes.md",
        "kvconf/parser.py",
    ]  # and no __pycache__ from the agent's own test run

    with task_sandbox(KVCONF, tmp_path / "replay") as sandbox:
        apply_patch(sandbox, first.patch, allow_fuzz=False)
        assert sandbox.read_file(f"{sandbox.workdir}/kvconf/blob.bin") == binary
        replayed = grade(KVCONF, sandbox, timeout_s=120)
    assert replayed.outcome == "passed"
    assert replayed.patch == first.patch


# --- runs that end badly ------------------------------------------------------------------------


def test_tests_that_run_past_the_timeout_are_killed_and_reported_as_timeout(tmp_path: Path):
    hanging = replace(
        SPANS,
        install_config={
            "test_cmd": f"echo 'PASSED {SPANS.FAIL_TO_PASS[0]}'; sleep 60",
            "log_parser": "pytest",
        },
    )
    with task_sandbox(hanging, tmp_path) as sandbox:
        result = grade(hanging, sandbox, timeout_s=1)
    assert result.outcome == "timeout"
    assert "ran past 1s" in (result.error or "")
    assert result.duration_s < 20


def test_a_real_hanging_test_is_killed_at_the_timeout_and_reported_as_timeout(tmp_path: Path):
    with task_sandbox(HANG, tmp_path) as sandbox:
        result = grade(HANG, sandbox, timeout_s=2)
    assert result.outcome == "timeout"
    assert result.duration_s < 20


def test_a_run_that_reports_no_tests_is_a_failure_not_a_pass(tmp_path: Path):
    silent = replace(
        SPANS, install_config={"test_cmd": "echo collected 0 items", "log_parser": "pytest"}
    )
    with task_sandbox(silent, tmp_path) as sandbox:
        result = grade(silent, sandbox, timeout_s=60)
    assert result.outcome == "failed"
    assert result.reason == "incomplete"  # pytest never ran, so it never reported
    assert result.tests == {}
    assert result.f2p.missing == len(SPANS.FAIL_TO_PASS)
    assert result.p2p.missing == len(SPANS.PASS_TO_PASS)


def test_a_test_patch_that_does_not_apply_is_an_infra_error(tmp_path: Path):
    broken = replace(
        SPANS,
        test_patch=SPANS.test_patch.replace(
            " def test_total_length_of_sorted_intervals():", " def test_renamed_upstream():"
        ),
    )
    with task_sandbox(broken, tmp_path) as sandbox:
        result = grade(broken, sandbox, timeout_s=60)
    assert result.outcome == "infra_error"
    assert result.error is not None and result.error.startswith("test_patch did not apply")
    assert "tests/test_merge.py" in result.error


def test_an_agent_that_deletes_git_is_graded_against_a_rebuilt_base_and_no_outer_repo_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    outer = tmp_path / "outer-checkout"  # sandboxes created inside someone's git checkout
    outer.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=outer, check=True)
    monkeypatch.setattr(tempfile, "tempdir", str(outer))
    with task_sandbox(KVCONF, tmp_path) as sandbox:
        apply_patch(sandbox, KVCONF.patch)
        sandbox.exec("rm -rf .git", cwd=sandbox.workdir)
        result = grade(KVCONF, sandbox, timeout_s=60)
        staged = subprocess.run(
            ["git", "diff", "--cached", "--name-only"], cwd=outer, capture_output=True, text=True
        )
    assert result.outcome == "passed", (result.error, result.failing)
    assert paths_touched_by(result.patch) == ["kvconf/parser.py"]
    assert "rebuilt it from the task's repo/" in result.notes[0]
    assert staged.stdout == ""


def test_an_agent_that_replaces_git_with_a_fresh_repo_gets_the_base_back_and_fails_unfixed(
    tmp_path: Path,
):
    with task_sandbox(KVCONF, tmp_path) as sandbox:
        sandbox.exec(
            "rm -rf .git && git init -q && git add -A && "
            "git -c user.name=a -c user.email=a@b commit -qm mine",
            cwd=sandbox.workdir,
        )
        result = grade(KVCONF, sandbox, timeout_s=60)
    assert result.outcome == "failed" and result.error is None
    assert result.patch == ""  # the agent changed no file: its new history is not a change
    assert result.notes


def test_a_dataset_row_whose_git_was_deleted_fails_with_a_reason(tmp_path: Path):
    with task_sandbox(KVCONF, tmp_path) as sandbox:
        sandbox.exec("rm -rf .git", cwd=sandbox.workdir)
        result = grade(replace(KVCONF, repo_dir=None), sandbox, timeout_s=60)
    assert result.outcome == "failed"
    assert "was .git deleted?" in (result.error or "")
    assert "dataset row" in (result.error or "")


def test_grading_with_junit_xml_ignores_a_report_the_agent_planted(tmp_path: Path):
    junit = replace(
        SPANS,
        install_config={
            "test_cmd": "python -m pytest -p no:cacheprovider -o junit_family=xunit1 "
            "--junitxml=report.xml tests",
            "log_parser": "junit",
            "junit_xml": "report.xml",
        },
    )
    planted = "".join(
        f'<testcase file="{t.split("::")[0]}" classname="x" name="{t.split("::", 1)[1]}"/>'
        for t in SPANS.FAIL_TO_PASS
    )
    with task_sandbox(junit, tmp_path / "cheat") as sandbox:
        write(sandbox, "report.xml", f"<testsuites><testsuite>{planted}</testsuite></testsuites>")
        cheated = grade(junit, sandbox, timeout_s=120)
    assert cheated.outcome == "failed" and cheated.reason == "tests_failed"
    assert all(cheated.tests[t] == TestStatus.FAILED for t in SPANS.FAIL_TO_PASS)

    with task_sandbox(junit, tmp_path / "gold") as sandbox:
        apply_patch(sandbox, SPANS.patch)
        fixed = grade(junit, sandbox, timeout_s=120)
    assert fixed.outcome == "passed", fixed.failing
    assert set(fixed.tests) == set(SPANS.FAIL_TO_PASS + SPANS.PASS_TO_PASS)


def test_a_junit_report_from_another_tool_must_add_up(tmp_path: Path):
    def report(stated: int) -> str:
        cases = "".join(f'<testcase classname="t" name="{n}"/>' for n in ("f2p", "p2p"))
        return f'<testsuite name="s" tests="{stated}" failures="0">{cases}</testsuite>'

    tool = replace(SPANS, FAIL_TO_PASS=["t::f2p"], PASS_TO_PASS=["t::p2p"], install_config={
        "test_cmd": "cat > out.xml <<'EOF'\n{}\nEOF", "log_parser": "junit", "junit_xml": "out.xml"})

    def graded(xml: str) -> GradeResult:
        task = replace(tool, install_config={
            **tool.install_config, "test_cmd": tool.install_config["test_cmd"].format(xml)})
        with task_sandbox(task, tmp_path / str(len(xml))) as sandbox:
            return grade(task, sandbox, timeout_s=60)

    assert graded(report(2)).outcome == "passed"  # no pytest, no plugin: the report is read
    forged = graded(report(5) + " ")
    assert forged.outcome == "failed" and forged.reason == "untrusted_log"
    assert "states tests=5 but holds 2" in (forged.error or "")


def test_a_registered_log_parser_grades_a_task_that_names_it(tmp_path: Path):
    def parse_tap(log: str) -> dict[str, TestStatus]:
        statuses = {}
        for line in log.splitlines():
            ok, _, name = line.partition(" - ")
            if ok in ("ok", "not ok"):
                statuses[name] = TestStatus.PASSED if ok == "ok" else TestStatus.FAILED
        return statuses

    register_log_parser("tap-test", parse_tap)
    try:
        tap = replace(
            SPANS,
            FAIL_TO_PASS=["merges"],
            PASS_TO_PASS=["loads"],
            install_config={
                "test_cmd": "echo 'ok - loads'; echo 'ok - merges'",
                "log_parser": "tap-test",
            },
        )
        with task_sandbox(tap, tmp_path) as sandbox:
            assert grade(tap, sandbox, timeout_s=60).outcome == "passed"
        with pytest.raises(ValueError, match="already registered"):
            register_log_parser("tap-test", parse_tap)
    finally:
        _PARSERS.pop("tap-test")


# --- agents that print fake results --------------------------------------------------------------

# Code under test (the package's __init__, imported by the tests) that gets past pytest's output
# capture and prints a PASSED line for every judged test, then...
_FAKE_LINES = PAST_THE_CAPTURE + """for _test in {ids!r}:
    print("PASSED " + _test)
sys.stdout.flush()
"""
_EXIT_EARLY = "os._exit(0)\n"  # ...dies before pytest can report, or lets pytest carry on


@pytest.mark.parametrize("ending", ["exit-early", "carry-on"])
def test_passed_lines_printed_by_the_code_under_test_do_not_pass(tmp_path: Path, ending: str):
    code = _FAKE_LINES.format(ids=KVCONF.FAIL_TO_PASS + KVCONF.PASS_TO_PASS)
    if ending == "exit-early":
        code += _EXIT_EARLY
    with task_sandbox(KVCONF, tmp_path) as sandbox:
        init = read(sandbox, "kvconf/__init__.py")
        write(sandbox, "kvconf/__init__.py", code + init)
        result = grade(KVCONF, sandbox, timeout_s=120)
    assert result.outcome == "failed"
    assert "PASSED " + KVCONF.FAIL_TO_PASS[0] in result.test_output  # the lines were printed
    if ending == "exit-early":
        assert result.reason == "incomplete"
        assert "never finished" in (result.error or "")
    else:  # the runner's own report says the F2P test failed, whatever was printed
        assert result.reason == "tests_failed"
        assert result.tests[KVCONF.FAIL_TO_PASS[0]] == TestStatus.FAILED


def test_a_junit_report_outside_the_tree_ignores_fake_lines_and_fake_xml_on_stdout(
    tmp_path: Path,
):
    fake_xml = "".join(
        f'<testcase file="tests/test_double.py" classname="x" name="{t.split("::")[1]}"/>'
        for t in JUNIT.FAIL_TO_PASS + JUNIT.PASS_TO_PASS
    )
    code = (
        _FAKE_LINES.format(ids=JUNIT.FAIL_TO_PASS + JUNIT.PASS_TO_PASS)
        + f"print('<testsuites><testsuite>{fake_xml}</testsuite></testsuites>')\n"
        + "sys.stdout.flush()\nos._exit(0)\n"
    )
    with task_sandbox(JUNIT, tmp_path / "cheat") as sandbox:
        write(sandbox, "double.py", code + read(sandbox, "double.py"))
        cheated = grade(JUNIT, sandbox, timeout_s=120)
    assert cheated.outcome == "failed" and cheated.reason == "incomplete"
    assert cheated.tests == {}

    with task_sandbox(JUNIT, tmp_path / "gold") as sandbox:
        apply_patch(sandbox, JUNIT.patch)
        fixed = grade(JUNIT, sandbox, timeout_s=120)
        leftovers = sandbox.exec("ls -a ~ | grep -c harness-gym || true").stdout.strip()
    assert fixed.outcome == "passed", (fixed.error, fixed.test_output)
    assert set(fixed.tests) == set(JUNIT.FAIL_TO_PASS + JUNIT.PASS_TO_PASS)
    assert leftovers == "0"  # the grader removes its report and its directory


def test_pytest_session_totals_sum_every_session_and_read_quiet_summaries():
    log = "== 1 failed, 2 passed, 1 warning in 0.1s ==\nx\n3 passed, 1 error in 0.02s\n"
    assert pytest_session_totals(log) == {"failed": 1, "passed": 5, "warnings": 1, "errors": 1}
    assert pytest_session_totals("PASSED t.py::test_a\n") is None
    # pytest < 6, a long run, and a plugin's own counts (which are not tests passing)
    assert pytest_session_totals("===== 4 passed in 0.12 seconds =====") == {"passed": 4}
    assert pytest_session_totals("== 2 failed in 65.10s (0:01:05) ==") == {"failed": 2}
    assert pytest_session_totals("== 3 passed, 2 subtests passed in 0.1s ==") == {"passed": 3}


# --- malformed diffs and flaky tasks ------------------------------------------------------------


def test_a_malformed_gold_patch_is_an_apply_error_that_leaves_the_tree_untouched(tmp_path: Path):
    with task_sandbox(BADPATCH, tmp_path) as sandbox:
        with pytest.raises(PatchApplyError, match=r"(?s)git apply.*patch --batch"):
            apply_patch(sandbox, BADPATCH.patch)
        with pytest.raises(PatchApplyError, match="not a unified diff"):
            apply_patch(sandbox, "please apply my fix: greet should say Hello\n")
        with pytest.raises(PatchApplyError, match="must be text"):
            apply_patch(sandbox, None)  # type: ignore[arg-type]
        status = sandbox.exec("git status --porcelain --ignored", cwd=sandbox.workdir)
    assert status.stdout == ""  # no half-applied hunk, no .rej or .orig files


def test_validate_task_reports_a_gold_patch_that_does_not_apply_once(tmp_path: Path):
    report = validate_task(BADPATCH, LocalSandboxBackend(), runs=3, env=PYTHON_PATH_ENV)
    assert not report.ok and report.runs == []
    assert report.problems[0].startswith("the gold patch does not apply")


def test_validate_task_finds_tests_that_change_status_between_identical_runs():
    report = validate_task(FLAKY, LocalSandboxBackend(), runs=3, env=PYTHON_PATH_ENV)
    assert len(report.runs) == 3
    assert report.flaky  # 8 coin flips x 3 runs: all agreeing has odds of 4**-8
    assert all(test.startswith("tests/test_lucky.py::test_lucky_draw[") for test in report.flaky)
    assert all(len(statuses) == 3 for statuses in report.flaky.values())
    assert any("flaky" in problem for problem in report.problems)


def test_validate_task_passes_a_sound_task():
    backend = LocalSandboxBackend()
    report = validate_task(UNITTEST, backend, runs=2, env=PYTHON_PATH_ENV, check_unfixed=True)
    assert report.ok, report.problems
    assert [run.outcome for run in report.runs] == ["passed", "passed"]
    assert report.unfixed is not None and report.unfixed.outcome == "failed"


def test_validate_task_catches_a_fail_to_pass_test_that_already_passes():
    mislabelled = replace(UNITTEST, FAIL_TO_PASS=UNITTEST.PASS_TO_PASS, PASS_TO_PASS=[])
    report = validate_task(
        mislabelled, LocalSandboxBackend(), runs=1, env=PYTHON_PATH_ENV, check_unfixed=True
    )
    assert report.problems == [
        "FAIL_TO_PASS test(s) pass without the fix: ['test_low (tests.test_clamp.ClampTest)']"
    ]


# --- other test frameworks and stricter verdicts ------------------------------------------------


def test_a_unittest_task_is_graded_from_verbose_unittest_output(tmp_path: Path):
    with task_sandbox(UNITTEST, tmp_path / "unfixed") as sandbox:
        unfixed = grade(UNITTEST, sandbox, timeout_s=60)
    with task_sandbox(UNITTEST, tmp_path / "fixed") as sandbox:
        apply_patch(sandbox, UNITTEST.patch)
        fixed = grade(UNITTEST, sandbox, timeout_s=60)
    high, low = UNITTEST.FAIL_TO_PASS[0], UNITTEST.PASS_TO_PASS[0]
    assert unfixed.outcome == "failed"
    assert unfixed.tests[high] == TestStatus.FAILED and unfixed.tests[low] == TestStatus.PASSED
    assert fixed.outcome == "passed", fixed.test_output
    assert fixed.tests["test_nan (tests.test_clamp.ClampTest)"] == TestStatus.SKIPPED


def test_the_unittest_parser_reads_django_and_python_3_11_styles():
    log = (
        "test_a (app.tests.T) ... ok\n"
        "test_b (app.tests.T.test_b) ... FAIL\n"
        "test_c (app.tests.T)\nA docstring. ... ok\n"
        "test_d (app.tests.T) ... some output\nERROR\n"
        "test_e (app.tests.T) ... skipped 'no db'\n"
        "test_f (app.tests.T) ... expected failure\n"
        "ERROR: test_g (app.tests.T)\n"
    )
    assert parse_unittest_log(log) == {
        "test_a (app.tests.T)": TestStatus.PASSED,
        "test_b (app.tests.T)": TestStatus.FAILED,
        "test_c (app.tests.T)": TestStatus.PASSED,
        "test_d (app.tests.T)": TestStatus.ERROR,
        "test_e (app.tests.T)": TestStatus.SKIPPED,
        "test_f (app.tests.T)": TestStatus.XFAIL,
        "test_g (app.tests.T)": TestStatus.ERROR,
    }


def test_exact_test_set_also_fails_a_run_where_another_test_failed(tmp_path: Path):
    floats = "tests/test_other.py::test_add_floats"
    unjudged = replace(CALC, PASS_TO_PASS=[t for t in CALC.PASS_TO_PASS if t != floats])
    exact = replace(unjudged, install_config={**CALC.install_config, "exact_test_set": True})
    regression = "def add(a, b):\n    return round(a + b)\n"
    with task_sandbox(CALC, tmp_path) as sandbox:
        apply_patch(sandbox, CALC.patch)
        write(sandbox, "calc/core.py", read(sandbox, "calc/core.py").replace(
            "def add(a, b):\n    return a + b\n", regression))
        write(sandbox, "tests/test_mine.py", "def test_mine():\n    assert False\n")
        lenient = grade(unjudged, sandbox, timeout_s=120)
        strict = grade(exact, sandbox, timeout_s=120)  # grading again re-restores the test files
    assert lenient.outcome == "passed"  # SWE-bench: tests outside F2P/P2P don't count
    assert "tests/test_mine.py" in " ".join(lenient.notes)  # the agent's own test is removed
    assert strict.outcome == "failed"
    assert strict.failing == [floats]
    assert judge_tests(unjudged, lenient.tests, exact_test_set=True)[0] == "failed"


# --- the verdict --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "f2p_status,p2p_status,outcome",
    [
        (TestStatus.PASSED, TestStatus.PASSED, "passed"),
        (TestStatus.XFAIL, TestStatus.PASSED, "failed"),  # SWE-bench counts XFAIL; we don't
        (TestStatus.PASSED, TestStatus.XFAIL, "failed"),
        (TestStatus.PASSED, TestStatus.SKIPPED, "failed"),  # a skipped P2P test proves nothing
        (TestStatus.SKIPPED, TestStatus.PASSED, "failed"),
        (TestStatus.XPASS, TestStatus.PASSED, "failed"),
        (TestStatus.PASSED, TestStatus.XPASS, "failed"),
        (TestStatus.PASSED, TestStatus.ERROR, "failed"),
        (TestStatus.PASSED, None, "failed"),  # a P2P test missing from the report
    ],
)
def test_only_a_genuine_pass_counts_for_f2p_and_p2p(f2p_status, p2p_status, outcome):
    task = replace(SPANS, FAIL_TO_PASS=["t::f2p"], PASS_TO_PASS=["t::p2p"])
    tests = {"t::f2p": f2p_status, **({"t::p2p": p2p_status} if p2p_status else {})}
    assert judge_tests(task, tests)[0] == outcome


def test_a_dataset_row_is_restored_from_its_own_git_tree(tmp_path: Path):
    """A row has no repo/ on the host: the base listing comes from the sandbox's git tree."""
    row = replace(CALC, repo_dir=None)
    hide = "def test_add_floats():\n    pass\n\n\ndef test_add_is_commutative():\n    pass\n"
    with task_sandbox(CALC, tmp_path / "gold") as sandbox:
        apply_patch(sandbox, CALC.patch)
        gold = grade(row, sandbox, timeout_s=120)
    with task_sandbox(CALC, tmp_path / "cheat") as sandbox:
        apply_patch(sandbox, CALC.patch)
        write(sandbox, "calc/core.py", read(sandbox, "calc/core.py").replace(
            "return a + b", "return round(a + b)"))
        write(sandbox, "tests/test_other.py", hide)
        cheat = grade(row, sandbox, timeout_s=120)
    assert gold.outcome == "passed", (gold.error, gold.test_output[-2000:])
    assert cheat.outcome == "failed" and cheat.failing == ["tests/test_other.py::test_add_floats"]
    assert "tests/test_other.py" in " ".join(cheat.notes)
