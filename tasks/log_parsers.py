"""Test-log parsers: a test run's output in, `{test id: TestStatus}` out.

A task names its parser in `install_config["log_parser"]`; `get_log_parser(name)` looks it up in
a registry that `register_log_parser` extends, so a suite for another test framework adds its
parser without touching the grader. Built-ins: `pytest` (the `-rA` short summary, plus `-v`
progress lines when present), `unittest` / `django` (`test_x (module.Class) ... ok` lines of
`unittest -v` and Django's runner) and `junit` (JUnit XML found anywhere in the text).

`pytest_session_totals` reads pytest's closing `N passed, M failed in 1.2s` line(s); the grader
checks a pytest log's report lines against it, so lines a test or conftest printed cannot stand
in for a run that never finished.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from xml.etree import ElementTree

__all__ = [
    "LogParser",
    "TestStatus",
    "UnknownLogParserError",
    "get_log_parser",
    "log_parser_names",
    "parse_junit_xml",
    "parse_pytest_log",
    "junit_summary_problems",
    "parse_unittest_log",
    "pytest_session_totals",
    "register_log_parser",
]


class TestStatus(enum.StrEnum):
    __test__ = False  # not a pytest test class, despite the name

    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    XFAIL = "XFAIL"
    XPASS = "XPASS"


LogParser = Callable[[str], dict[str, TestStatus]]

# A failing report beats any other report of the same test: pytest prints both PASSED and ERROR
# for a test whose teardown fails, and a test may echo a fake "PASSED <id>" line to stdout.
_FAILING = frozenset({TestStatus.FAILED, TestStatus.ERROR})


def _record(statuses: dict[str, TestStatus], test_id: str, status: TestStatus) -> None:
    if statuses.get(test_id) in _FAILING:
        return
    if test_id not in statuses or status in _FAILING:
        statuses[test_id] = status


# --- pytest -------------------------------------------------------------------------------------

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STATUS_WORDS = "|".join(status.value for status in TestStatus)
# `PASSED tests/test_a.py::test_x[a b]` / `FAILED tests/test_a.py::test_y - AssertionError: ...`
_SUMMARY_LINE = re.compile(rf"^(?P<status>{_STATUS_WORDS}) (?P<rest>.+)$")
# `tests/test_a.py::test_x[a b] PASSED      [ 50%]` (pytest -v); SKIPPED only has ids here.
_VERBOSE_LINE = re.compile(
    rf"^(?P<id>\S[^\s:]*::.+?) (?P<status>{_STATUS_WORDS})(?: \(.*\))?\s*(?:\[\s*\d+%\])?\s*$"
)


def _summary_node_id(rest: str, status: TestStatus) -> str | None:
    """The node id at the start of a short-summary line's remainder.

    Parametrized ids may hold spaces, " - " and unbalanced brackets (`test_p[c]d]`), and pytest
    appends ` - message` to non-passing lines; the id ends at the first `]` that is followed by
    the end of the line or by ` - `.
    """
    if rest.startswith("["):  # `SKIPPED [1] tests/a.py:12: reason` names a location, not an id
        return None
    head = rest.split(" ", 1)[0]
    bracket = head.find("[")
    if bracket != -1 and "::" in head[:bracket]:
        for match in re.finditer(r"\]", rest):
            after = rest[match.end() :]
            if after == "" or after.startswith(" - "):
                return rest[: match.end()]
    node_id = rest.split(" - ", 1)[0]
    if status in (TestStatus.XFAIL, TestStatus.XPASS):
        node_id = node_id.split()[0]  # pytest < 8 wrote `XPASS id reason` without the dash
    return node_id.strip() or None


def parse_pytest_log(log: str) -> dict[str, TestStatus]:
    """Parse pytest output run with `-rA` (and optionally `-v`).

    >>> parse_pytest_log("PASSED tests/t.py::test_a\\nFAILED tests/t.py::test_b[x - y] - boom")
    {'tests/t.py::test_a': <TestStatus.PASSED: 'PASSED'>, \
'tests/t.py::test_b[x - y]': <TestStatus.FAILED: 'FAILED'>}

    A collection error yields `ERROR tests/t.py` (a file id), so the file's tests stay missing.
    """
    statuses: dict[str, TestStatus] = {}
    for raw_line in log.splitlines():
        line = _ANSI_ESCAPE.sub("", raw_line).rstrip()
        if summary := _SUMMARY_LINE.match(line):
            status = TestStatus(summary["status"])
            if node_id := _summary_node_id(summary["rest"], status):
                _record(statuses, node_id, status)
        elif verbose := _VERBOSE_LINE.match(line):
            _record(statuses, verbose["id"], TestStatus(verbose["status"]))
    return statuses


# pytest's last line: `==== 2 failed, 5 passed, 1 warning in 0.12s ====` (`-qq` drops the `=`,
# pytest < 6 writes `in 0.12 seconds`, plugins add counts like `2 subtests passed`).
_SESSION_LINE = re.compile(
    r"^=*\s*(?P<counts>\d+ [a-z].*?|no tests ran) in [\d.]+ ?(?:s|seconds)(?: \([^)]*\))?\s*=*$"
)
_COUNT = re.compile(r"(\d+) ([a-z]+)(?=,|$)")
_COUNT_WORDS = {"error": "errors", "warning": "warnings"}


def pytest_session_totals(log: str) -> dict[str, int] | None:
    """Summed counts of every pytest session summary line in `log` (`{"passed": 5, ...}`), or
    None when there is none: pytest never finished (it was killed, `os._exit`ed, or not run).

    >>> pytest_session_totals("=== 1 failed, 2 passed in 0.10s ===")
    {'failed': 1, 'passed': 2}
    """
    totals: dict[str, int] | None = None
    for raw_line in log.splitlines():
        line = _ANSI_ESCAPE.sub("", raw_line).strip()
        if session := _SESSION_LINE.match(line):
            totals = totals if totals is not None else {}
            for number, word in _COUNT.findall(session["counts"]):
                word = _COUNT_WORDS.get(word, word)
                totals[word] = totals.get(word, 0) + int(number)
    return totals


# --- unittest and Django ------------------------------------------------------------------------

_UNITTEST_WORDS = {
    "ok": TestStatus.PASSED,
    "FAIL": TestStatus.FAILED,
    "ERROR": TestStatus.ERROR,
    "expected failure": TestStatus.XFAIL,
    "unexpected success": TestStatus.XPASS,
}
# `test_x (pkg.mod.Class) ... ok`; Python >= 3.11 writes `(pkg.mod.Class.test_x)`.
_UNITTEST_ID = r"(?P<name>[^\s(]+) \((?P<where>[\w.]+)\)"
_UNITTEST_LINE = re.compile(rf"^{_UNITTEST_ID} \.\.\. ?(?P<word>.*)$")
_UNITTEST_HEADER = re.compile(rf"^(?P<word>FAIL|ERROR): {_UNITTEST_ID}")
_UNITTEST_NAME_ONLY = re.compile(rf"^{_UNITTEST_ID}$")  # a docstring line follows


def _unittest_id(name: str, where: str) -> str:
    """SWE-bench's id, `test_x (pkg.mod.Class)`, the same on every Python version."""
    return f"{name} ({where.removesuffix('.' + name)})"


def _unittest_status(word: str) -> TestStatus | None:
    word = word.strip()
    if word.startswith("skipped"):
        return TestStatus.SKIPPED
    return _UNITTEST_WORDS.get(word)


def parse_unittest_log(log: str) -> dict[str, TestStatus]:
    """Parse `python -m unittest -v` / Django `runtests.py --verbosity 2` output.

    >>> parse_unittest_log("test_a (m.T) ... ok\\ntest_b (m.T.test_b) ... FAIL")
    {'test_a (m.T)': <TestStatus.PASSED: 'PASSED'>, 'test_b (m.T)': <TestStatus.FAILED: 'FAILED'>}

    A test with a docstring prints it on the next line (`Docstring ... ok`), and a test that
    prints leaves `test_x (m.T) ... ` open until its status word arrives on a line of its own;
    both are followed. `FAIL: test_x (m.T)` headers of the failure report count as well.
    """
    statuses: dict[str, TestStatus] = {}
    pending: str | None = None  # a test whose status word has not arrived yet
    for raw_line in log.splitlines():
        line = _ANSI_ESCAPE.sub("", raw_line).rstrip()
        if header := _UNITTEST_HEADER.match(line):
            status = TestStatus.FAILED if header["word"] == "FAIL" else TestStatus.ERROR
            _record(statuses, _unittest_id(header["name"], header["where"]), status)
            pending = None
        elif test := _UNITTEST_LINE.match(line):
            test_id = _unittest_id(test["name"], test["where"])
            status = _unittest_status(test["word"])
            if status is None:
                pending = test_id
            else:
                _record(statuses, test_id, status)
                pending = None
        elif named := _UNITTEST_NAME_ONLY.match(line):
            pending = _unittest_id(named["name"], named["where"])
        elif pending is not None:
            word = line.rsplit(" ... ", 1)[-1] if " ... " in line else line
            if (status := _unittest_status(word)) is not None:
                _record(statuses, pending, status)
                pending = None
    return statuses


# --- JUnit XML ----------------------------------------------------------------------------------

_JUNIT_DOCUMENT = re.compile(
    r"<testsuites\b.*?</testsuites>|<testsuite\b.*?</testsuite>|<testsuites\b[^>]*/>",
    re.DOTALL,
)


def _junit_test_id(case: ElementTree.Element) -> str:
    """`classname::name`, or the pytest node id when the case carries a `file` attribute
    (pytest's `junit_family=xunit1`), so F2P ids written as pytest node ids still match."""
    name = case.get("name", "")
    classname = case.get("classname", "")
    file = case.get("file")
    if file:
        module = file.removesuffix(".py").replace("/", ".")
        classes = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
        return "::".join(part for part in (file, *classes.split("."), name) if part)
    return f"{classname}::{name}" if classname else name


def _junit_status(case: ElementTree.Element) -> TestStatus:
    if case.find("error") is not None:
        return TestStatus.ERROR
    if case.find("failure") is not None:
        return TestStatus.FAILED
    skipped = case.find("skipped")
    if skipped is not None:
        return TestStatus.XFAIL if skipped.get("type") == "pytest.xfail" else TestStatus.SKIPPED
    return TestStatus.PASSED


def parse_junit_xml(log: str) -> dict[str, TestStatus]:
    """Parse every JUnit XML document found in `log` (a report file, or output that `cat`s one).

    Test ids are `classname::name`; see `_junit_test_id` for pytest reports. Malformed documents
    are skipped: an unreadable report must read as "no tests seen", never as a pass.
    """
    statuses: dict[str, TestStatus] = {}
    for document in _JUNIT_DOCUMENT.finditer(log):
        try:
            root = ElementTree.fromstring(document.group(0))
        except ElementTree.ParseError:
            continue
        for case in root.iter("testcase"):
            _record(statuses, _junit_test_id(case), _junit_status(case))
    return statuses


def junit_summary_problems(log: str) -> str | None:
    """Why a JUnit report does not add up, or None: each `<testsuite>` states how many tests,
    failures, errors and skips it holds, and a report assembled by hand (printed by the code
    under test, or planted) rarely keeps those in step with its test cases."""
    seen = False
    for document in _JUNIT_DOCUMENT.finditer(log):
        try:
            root = ElementTree.fromstring(document.group(0))
        except ElementTree.ParseError:
            return "a report document is not well-formed XML"
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for suite in suites:
            cases = list(suite.iter("testcase"))
            seen = seen or bool(cases)
            counts = {
                "tests": len(cases),
                "failures": sum(c.find("failure") is not None for c in cases),
                "errors": sum(c.find("error") is not None for c in cases),
                "skipped": sum(c.find("skipped") is not None for c in cases),
            }
            for name, actual in counts.items():
                stated = suite.get(name)
                if stated is None and name == "tests":
                    return f"testsuite {suite.get('name')!r} does not say how many tests it ran"
                if stated is not None and stated.strip() != str(actual):
                    return (
                        f"testsuite {suite.get('name')!r} states {name}={stated} but holds "
                        f"{actual} such test case(s)"
                    )
    return None if seen else "no test cases"


# --- registry -----------------------------------------------------------------------------------


class UnknownLogParserError(KeyError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"unknown log_parser {name!r}; known parsers: {', '.join(log_parser_names())} "
            "(add one with harness_gym.tasks.register_log_parser)"
        )

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0])


_PARSERS: dict[str, LogParser] = {}


def register_log_parser(name: str, parser: LogParser, *, replace: bool = False) -> None:
    """Make `parser` available to tasks whose `install_config["log_parser"]` is `name`."""
    if name in _PARSERS and not replace:
        raise ValueError(f"log parser {name!r} is already registered; pass replace=True")
    _PARSERS[name] = parser


def get_log_parser(name: str) -> LogParser:
    try:
        return _PARSERS[name]
    except KeyError:
        raise UnknownLogParserError(name) from None


def log_parser_names() -> list[str]:
    return sorted(_PARSERS)


register_log_parser("pytest", parse_pytest_log)
# SWE-bench / SWE-rebench rows name the same -rA summary format this way.
register_log_parser("parse_log_pytest", parse_pytest_log)
register_log_parser("parse_log_pytest_v2", parse_pytest_log)
register_log_parser("junit", parse_junit_xml)
register_log_parser("unittest", parse_unittest_log)
register_log_parser("django", parse_unittest_log)
register_log_parser("parse_log_django", parse_unittest_log)

# Parsers that read pytest's own output: the grader holds their logs to pytest's session totals.
PYTEST_LOG_PARSERS = frozenset({"pytest", "parse_log_pytest", "parse_log_pytest_v2"})
