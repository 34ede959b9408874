"""What the grader restores and removes before the tests run (tasks/test_scope.py), and how it
reads the in-sandbox reporter's channel (tasks/grading_report.py): pure functions, no sandbox."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness_gym.tasks import TestStatus
from harness_gym.tasks.grading_report import read_report
from harness_gym.tasks.sandbox_grading.channel import Channel, encode
from harness_gym.tasks.test_scope import (
    BaseEntry,
    in_test_scope,
    plan_restore,
    runner_config_section,
    find_test_directories,
)

BASE = {
    path: BaseEntry("100644", f"{index:040x}")
    for index, path in enumerate(
        [
            "pyproject.toml",
            "setup.cfg",
            "pkg/__init__.py",
            "pkg/core.py",
            "pkg/test_inline.py",  # a test file next to the code
            "pkg/testing/helpers.py",  # library code in a dir named testing: not a test dir
            "django/test/client.py",  # library code in a dir named test
            "tests/conftest.py",
            "tests/helpers.py",
            "tests/data/input.json",
            "tests/unit/test_core.py",
            "testing/test_runner.py",  # pytest's own layout
        ]
    )
}


def _disk(*extra: tuple[str, str]) -> dict[str, str]:
    disk = {path: "f" for path in BASE}
    for path in BASE:
        parts = path.split("/")
        disk.update({"/".join(parts[: i + 1]): "d" for i in range(len(parts) - 1)})
    disk.update(dict(extra))
    return disk


def test_test_directories_are_named_tests_test_or_testing_and_hold_test_files():
    assert find_test_directories(BASE) == {"tests", "testing"}
    directories = find_test_directories(BASE)
    scoped = {p for p in BASE if in_test_scope(p, directories, frozenset())}
    assert scoped == {
        "pyproject.toml",
        "setup.cfg",
        "pkg/test_inline.py",
        "tests/conftest.py",
        "tests/helpers.py",
        "tests/data/input.json",
        "tests/unit/test_core.py",
        "testing/test_runner.py",
    }  # the library code under pkg/, pkg/testing/ and django/test/ stays the agent's


def test_the_plan_restores_the_whole_scope_and_removes_what_the_agent_planted():
    planted = [
        ("conftest.py", "f"),  # root conftest
        ("pkg/conftest.py", "f"),
        ("pytest.ini", "f"),
        ("tests/tox.ini", "f"),
        ("sitecustomize.py", "f"),
        ("pkg/evil.pth", "f"),
        ("tests/test_mine.py", "f"),  # an added test
        ("inspect.py", "f"),  # shadows the standard library under `python -m pytest`
        ("_pytest", "d"),
        ("_pytest/runner.py", "f"),
        ("src", "d"),
        ("src/pluggy", "d"),
        ("src/pluggy/__init__.py", "f"),
        ("pkg/__pycache__", "d"),
        ("pkg/__pycache__/core.cpython-311.pyc", "f"),  # the agent's own code: kept
        ("pkg/__pycache__/test_inline.cpython-311-pytest-9.2.0.pyc", "f"),  # a planted cache
        ("tests/__pycache__", "d"),
        ("pkg/notes.md", "f"),  # an ordinary new file: kept
        ("pkg/utils.py", "f"),
    ]
    plan = plan_restore(BASE, _disk(*planted), touched=["tests/unit/test_new.py"])
    assert plan.remove == [
        "_pytest",
        "conftest.py",
        "inspect.py",
        "pkg/__pycache__/test_inline.cpython-311-pytest-9.2.0.pyc",
        "pkg/conftest.py",
        "pkg/evil.pth",
        "pytest.ini",
        "sitecustomize.py",
        "src/pluggy",
        "tests/__pycache__",
        "tests/test_mine.py",
        "tests/tox.ini",
    ]
    assert "_pytest/" in plan.neutralised and "tests/test_mine.py" in plan.neutralised
    assert set(plan.restore) == {
        p for p in BASE if in_test_scope(p, find_test_directories(BASE), frozenset())
    }
    assert plan.directories == ["testing", "tests"]  # swept of untracked, unignored files
    assert plan.verify["tests/helpers.py"] == BASE["tests/helpers.py"].blob


def test_links_and_files_where_the_task_has_directories_are_removed_first():
    disk = _disk(("tests/unit", "l"), ("tests/helpers.py", "l"), ("testing", "f"))
    plan = plan_restore(BASE, disk, touched=[])
    assert {"tests/unit", "tests/helpers.py", "testing"} <= set(plan.remove)
    assert "tests/unit/test_core.py" in plan.restore


def test_an_edited_shared_config_is_kept_only_when_its_test_sections_are_the_tasks():
    plan = plan_restore(BASE, _disk(), touched=[], keep=["pyproject.toml"])
    assert "pyproject.toml" not in plan.restore and "setup.cfg" in plan.restore
    touched = plan_restore(BASE, _disk(), touched=["pyproject.toml"], keep=["pyproject.toml"])
    assert "pyproject.toml" in touched.restore  # the test patch changes it: always the task's


@pytest.mark.parametrize(
    "name,before,after,same",
    [
        ("pyproject.toml", '[project]\nname="a"\n[tool.pytest.ini_options]\nx=1\n',
         '[project]\nname="b"\n[tool.pytest.ini_options]\nx=1\n', True),
        ("pyproject.toml", "[tool.pytest.ini_options]\nx = 1\n",
         '[tool]\npytest.ini_options = { x = 1, addopts = "-p evil" }\n', False),
        ("pyproject.toml", "[tool.black]\nline-length = 99\n",
         '[tool.black]\nline-length = 99\n[tool.pytest]\naddopts = ["-p", "evil"]\n', False),
        ("pyproject.toml", "[tool.pytest.ini_options]\nx = 1\n", "not toml [", False),
        ("setup.cfg", "[metadata]\nname = a\n[tool:pytest]\naddopts = -ra\n",
         "[metadata]\nname = b\n[tool:pytest]\naddopts = -ra\n", True),
        ("setup.cfg", "[tool:pytest]\naddopts = -ra\n", "[tool:pytest]\naddopts = -ra -p evil\n",
         False),
        ("tox.ini", "[tox]\nenvlist = py3\n[testenv]\ncommands = pytest\n",
         "[tox]\nenvlist = py3\n[testenv]\ncommands = true\n", False),
        ("tox.ini", "[flake8]\nmax-line-length = 99\n", "[flake8]\nmax-line-length = 120\n", True),
    ],
)  # fmt: skip
def test_config_sections_compare_what_pytest_and_tox_read(name, before, after, same):
    assert (runner_config_section(name, before) == runner_config_section(name, after)) is same


# --- the channel ---------------------------------------------------------------------------------

KEYS = {0: b"k0" * 16, 1: b"k1" * 16}


def _session(path: Path, session: int, *tests: tuple[str, str], end: bool = True) -> list[str]:
    """What a real Channel writes for one runner session, as lines."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    channel = Channel(session, KEYS[session], fd, "/w")
    channel.record("start", runner="pytest", files=[])
    for test, status in tests:
        channel.record("test", id=test, status=status, origin=None)
    if end:
        channel.record("end", exitstatus=0)
    channel.close()
    return path.read_text().splitlines()


def test_a_complete_session_gives_the_statuses_and_the_worst_report_wins(tmp_path: Path):
    lines = _session(tmp_path / "c", 0, ("t::a", "PASSED"), ("t::b", "PASSED"), ("t::b", "FAILED"))
    report = read_report("\n".join(lines), KEYS)
    assert report.incomplete() is None and report.forged == 0
    assert report.statuses == {"t::a": TestStatus.PASSED, "t::b": TestStatus.FAILED}


def test_lines_without_a_valid_mac_are_counted_as_forged_and_ignored(tmp_path: Path):
    lines = _session(tmp_path / "c", 0, ("t::a", "FAILED"))
    forged = lines[1].replace("FAILED", "PASSED")  # edited after signing
    printed = '{"id":"t::a","status":"PASSED","k":"test","s":0,"n":9}\t' + "0" * 64
    wrong_key = lines[1].rsplit("\t", 1)[0].replace('"s":0', '"s":1') + "\t" + "1" * 64
    report = read_report("\n".join([*lines, forged, printed, wrong_key, "garbage"]), KEYS)
    assert report.forged == 4
    assert report.statuses == {"t::a": TestStatus.FAILED}


def test_a_session_without_its_end_or_a_missing_earlier_session_is_incomplete(tmp_path: Path):
    lines = _session(tmp_path / "c", 0, ("t::a", "PASSED"), end=False)
    unfinished = read_report("\n".join(lines), KEYS)
    assert "never finished" in (unfinished.incomplete() or "")
    gap = read_report("\n".join(_session(tmp_path / "d", 1, ("t::a", "PASSED"))), KEYS)
    assert gap.statuses  # session 1 verifies, but session 0 was removed
    assert "missing" in (gap.incomplete() or "")
    assert "never reported" in (read_report("", KEYS).incomplete() or "")


def test_the_encoder_writes_json_the_host_reads_back():
    value = {"id": 't::a["x\\\\y"]\n\x00é', "n": [1, True, None, 2.5], "nested": {"a": []}}
    assert json.loads(encode(value)) == value
