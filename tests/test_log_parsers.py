"""Log parsers on real pytest, unittest and JUnit output, and the paths a real git diff touches."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_gym.tasks import (
    TestStatus,
    load_tasks,
    parse_junit_xml,
    parse_pytest_log,
)
from harness_gym.tasks.diffs import paths_touched_by

TASKS = {task.instance_id: task for task in load_tasks("builtin")}
SPANS = TASKS["harness-gym__spans-14"]  # test_patch modifies tests/test_merge.py
KVCONF = TASKS["harness-gym__kvconf-23"]  # test_patch creates tests/test_values.py
# Tasks built to misbehave: tests/fixtures/tasks/<id>/ (task.json + repo/, diffs made with git).
FIXTURES = {
    task.instance_id: task for task in load_tasks(Path(__file__).parent / "fixtures" / "tasks")
}
HANG = FIXTURES["fixture__hang-1"]  # the unfixed code loops forever on the F2P test
FLAKY = FIXTURES["fixture__flaky-2"]  # eight P2P tests pass by a coin flip
UNITTEST = FIXTURES["fixture__unittest-3"]  # python -m unittest -v, log_parser "unittest"
BADPATCH = FIXTURES["fixture__badpatch-4"]  # its gold patch is cut off mid-hunk
JUNIT = FIXTURES["fixture__junit-5"]  # junit_xml "auto": graded from a report outside the tree


# --- log parsers on real pytest output ----------------------------------------------------------

EVERY_STATUS = """
    import pytest

    def test_pass(): pass
    def test_fail(): assert 1 == 2
    @pytest.mark.skip(reason="not here")
    def test_skip(): pass
    @pytest.mark.xfail(reason="known")
    def test_xfail(): assert 0
    @pytest.mark.xfail(reason="known")
    def test_xpass(): pass
    @pytest.mark.parametrize("v", ["a b", "x - y", "c]d", "é"])
    def test_param(v): assert v != "x - y"
    @pytest.fixture
    def broken(): raise RuntimeError("setup")
    def test_error(broken): pass
    @pytest.fixture
    def bad_teardown():
        yield
        raise RuntimeError("teardown")
    def test_teardown(bad_teardown): pass
    class TestGroup:
        def test_method(self):
            print("PASSED tests/test_every.py::test_fail")  # a test echoing a fake summary line
"""

EXPECTED = {
    "tests/test_every.py::test_pass": TestStatus.PASSED,
    "tests/test_every.py::test_fail": TestStatus.FAILED,
    "tests/test_every.py::test_xfail": TestStatus.XFAIL,
    "tests/test_every.py::test_xpass": TestStatus.XPASS,
    "tests/test_every.py::test_param[a b]": TestStatus.PASSED,
    "tests/test_every.py::test_param[x - y]": TestStatus.FAILED,
    "tests/test_every.py::test_param[c]d]": TestStatus.PASSED,
    "tests/test_every.py::test_param[\\xe9]": TestStatus.PASSED,
    "tests/test_every.py::test_error": TestStatus.ERROR,
    "tests/test_every.py::test_teardown": TestStatus.ERROR,  # passed, then failed teardown
    "tests/test_every.py::TestGroup::test_method": TestStatus.PASSED,
}


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One real pytest run over every status: -rA output, -rA -v output, a JUnit report."""
    root = tmp_path_factory.mktemp("every")
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "tests" / "test_every.py").write_text(textwrap.dedent(EVERY_STATUS))
    base = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests"]

    def run(*extra: str) -> str:
        done = subprocess.run(
            [*base, *extra], cwd=root, capture_output=True, text=True, check=False
        )
        return done.stdout

    return {
        "summary": run(),
        "verbose": run("-v", "-s", "-o", "junit_family=xunit1", "--junitxml=report.xml"),
        "junit": (root / "report.xml").read_text(),
    }


def test_the_pytest_parser_reads_every_status_from_a_real_rA_summary(real_run):
    # A skipped test's summary line names a file:line, not a node id, so it is absent.
    assert parse_pytest_log(real_run["summary"]) == EXPECTED


def test_the_pytest_parser_also_reads_verbose_lines_which_name_skipped_tests(real_run):
    assert parse_pytest_log(real_run["verbose"]) == {
        **EXPECTED,
        "tests/test_every.py::test_skip": TestStatus.SKIPPED,
    }


def test_the_junit_parser_reads_a_real_pytest_report(real_run):
    assert parse_junit_xml(real_run["junit"]) == {
        **EXPECTED,
        "tests/test_every.py::test_skip": TestStatus.SKIPPED,
        "tests/test_every.py::test_xpass": TestStatus.PASSED,  # JUnit has no XPASS
    }
    # Embedded in other output (a test_cmd that cats the report) works the same.
    assert parse_junit_xml("noise\n" + real_run["junit"] + "\nmore") == parse_junit_xml(
        real_run["junit"]
    )


def test_the_pytest_parser_takes_old_xpass_lines_and_colour_codes():
    log = (
        "XPASS tests/t.py::test_a known bug\n"
        "\x1b[32mPASSED\x1b[0m tests/t.py::test_b\n"
        "FAILED tests/t.py::test_c[1-2] - assert [1] == [2]\n"
    )
    assert parse_pytest_log(log) == {
        "tests/t.py::test_a": TestStatus.XPASS,
        "tests/t.py::test_b": TestStatus.PASSED,
        "tests/t.py::test_c[1-2]": TestStatus.FAILED,
    }


def test_junit_ids_without_a_file_attribute_are_classname_and_name():
    report = (
        '<testsuite><testcase classname="com.acme.WidgetTest" name="spins"/>'
        '<testcase classname="com.acme.WidgetTest" name="stops"><failure/></testcase>'
        "<testcase broken</testsuite>"
    )
    assert parse_junit_xml(report) == {}  # malformed: nothing seen, never a pass
    assert parse_junit_xml(report.replace("<testcase broken", "")) == {
        "com.acme.WidgetTest::spins": TestStatus.PASSED,
        "com.acme.WidgetTest::stops": TestStatus.FAILED,
    }


# --- paths a diff touches, from real git diffs --------------------------------------------------


def test_paths_touched_by_a_real_diff_cover_renames_deletes_quoting_and_empty_files(
    tmp_path: Path,
):
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True
        ).stdout

    (tmp_path / "old name.py").write_text("x = 1\n" * 20)
    (tmp_path / "gone.sql").write_text("-- a comment\nselect 1;\n")
    (tmp_path / "kept.py").write_text("a = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    git("mv", "old name.py", "new name.py")
    (tmp_path / "gone.sql").unlink()
    (tmp_path / "kept.py").write_text("-- not a header\na = 2\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "tést.py").write_text("é = 1\n")
    git("add", "-A")
    diff = git("diff", "--cached", "-M")

    assert sorted(paths_touched_by(diff)) == sorted(
        ["old name.py", "new name.py", "gone.sql", "kept.py", "empty.txt", "tést.py"]
    )
