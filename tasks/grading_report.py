"""Reading what the grader's in-sandbox plugin reported (see `sandbox_grading`).

The channel file holds `<json>\\t<mac>` lines. `read_report(text, keys)` keeps the lines whose MAC
verifies under the key their session number names, counts the others as forged, and gathers the
sessions: each must have started and ended (or, for a helper process that claimed a key and ran
no tests, be idle), and their numbers must run 0, 1, 2, ... without a gap: keys are claimed in
that order, so a session the code under test suppressed (truncating the file, or killing its
process before its records) leaves a gap, and it cannot write records for a key it does not hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .log_parsers import TestStatus
from .sandbox_grading.channel import mac

__all__ = ["LoadedFile", "RunnerReport", "read_report"]

# Worst wins when a test is reported more than once (a rerun, two sessions).
_RANK = {
    TestStatus.PASSED: 0,
    TestStatus.SKIPPED: 1,
    TestStatus.XFAIL: 2,
    TestStatus.XPASS: 3,
    TestStatus.FAILED: 4,
    TestStatus.ERROR: 5,
}


@dataclass(frozen=True)
class LoadedFile:
    """A file the runner loaded: `kind` (plugin, late plugin: registered once collection had
    started, module, hookfile, inifile, runner), its path
    (relative to the work tree, or absolute outside it) and the blob id of what it read."""

    kind: str
    path: str
    blob: str | None
    detail: str = ""

    @property
    def in_tree(self) -> bool:
        return not self.path.startswith("/")


@dataclass
class RunnerReport:
    sessions: dict[int, dict[str, Any]] = field(default_factory=dict)  # number -> state
    statuses: dict[str, TestStatus] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # test -> where its skip/xfail came from
    # work-tree trace/profile functions: (file, line that installed it, or None: defined there)
    tracers: list[tuple[str, int | None]] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the plugin's own failures
    forged: int = 0  # lines that failed verification
    loaded: list[LoadedFile] = field(default_factory=list)
    rootdirs: list[str] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return bool(self.sessions)

    def incomplete(self) -> str | None:
        """Why the sessions do not add up to a finished run, or None."""
        if not self.sessions:
            return "the test runner never reported through the grader's plugin"
        numbers = sorted(self.sessions)
        if numbers != list(range(len(numbers))):
            missing = sorted(set(range(numbers[-1] + 1)) - set(numbers))
            return (
                f"runner session(s) {missing} are missing from the report although later ones "
                "exist: their records were removed or never written"
            )
        for number in numbers:
            state = self.sessions[number]
            if state.get("idle"):
                continue
            if not state.get("start"):
                return f"runner session {number} has no start record"
            if state.get("open", 0) > 0 or not state.get("end"):
                return (
                    f"runner session {number} ({state.get('runner', '?')}) never finished: the "
                    "process exited or was killed before the runner wrote its final report "
                    "(os._exit, a crash, a signal)"
                )
        if all(state.get("idle") for state in self.sessions.values()):
            return "the test command started no test run"
        return None


def _record(report: RunnerReport, test: str, status: TestStatus) -> None:
    previous = report.statuses.get(test)
    if previous is None or _RANK[status] > _RANK[previous]:
        report.statuses[test] = status


def read_report(text: str, keys: Mapping[int, bytes]) -> RunnerReport:
    """Verify and gather the channel's records (see the module doc)."""
    report = RunnerReport()
    for line in text.splitlines():
        if not line.strip():
            continue
        body, _, signature = line.rpartition("\t")
        try:
            fields = json.loads(body)
            key = keys[int(fields["s"])]
        except (ValueError, KeyError, TypeError):
            report.forged += 1
            continue
        if mac(key, body.encode("utf-8", "surrogateescape")) != signature:
            report.forged += 1
            continue
        _take(report, fields)
    return report


def _take(report: RunnerReport, fields: dict[str, Any]) -> None:
    number = int(fields["s"])
    state = report.sessions.setdefault(number, {"open": 0})
    kind = fields.get("k")
    if kind == "start":
        state["start"] = True
        state["open"] += 1
        state["runner"] = fields.get("runner")
        for path, blob in fields.get("files") or []:
            report.loaded.append(LoadedFile("runner", path, blob))
    elif kind == "end":
        state["end"] = True
        state["open"] -= 1
    elif kind == "idle":
        state["idle"] = True
    elif kind == "test":
        try:
            status = TestStatus(fields["status"])
        except (KeyError, ValueError):
            status = TestStatus.ERROR
        _record(report, str(fields["id"]), status)
        if fields.get("origin"):
            report.origins[str(fields["id"])] = str(fields["origin"])
    elif kind == "tracer":
        path, _blob = fields["file"]
        line = fields.get("line")
        report.tracers.append((str(path), int(line) if isinstance(line, int) else None))
    elif kind == "tamper":
        report.tampered.append(f"{fields.get('check')}: {fields.get('detail')}")
    elif kind == "error":
        report.errors.append(f"{fields.get('where')}: {fields.get('detail')}")
    elif kind == "config":
        if fields.get("rootdir"):
            report.rootdirs.append(str(fields["rootdir"]))
        if fields.get("inifile"):
            path, blob = fields["inifile"]
            report.loaded.append(LoadedFile("inifile", path, blob))
    elif kind in ("plugin", "module", "hookfile"):
        path, blob = fields["file"]
        detail = str(fields.get("name") or fields.get("hook") or "")
        if kind == "plugin" and fields.get("late"):
            kind = "late plugin"
        report.loaded.append(LoadedFile(kind, path, blob, detail))
