"""Running a project's suite in a sandbox, cached by content.

`SuiteRunner.run(tree, overrides)` copies `tree` into a fresh sandbox, writes `overrides` over it
(path -> text, None deletes), runs the test command with the grader's pytest settings (plugin
autoload off, so a baseline sees what grading will see) and parses per-test statuses with the
`pytest` log parser. The result is stored under `$HARNESS_GYM_CACHE/mine-runs/<sha256>.json`,
keyed by the tree's bytes, the overrides and the command: a re-run or a resumed mining run
reads it back instead of running the suite again.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...engines._cache import cache_root
from ...sandbox.base import SandboxBackend, SandboxSpec
from ..log_parsers import TestStatus, get_log_parser
from .project import IGNORED_DIRS, tree_digest

__all__ = ["RUNS_DIR", "SuiteRun", "SuiteRunner", "failure_excerpt"]

RUNS_DIR = "mine-runs"
HEAD_CHARS, TAIL_CHARS = 60_000, 10_000  # failures print first, the -rA summary last
RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONNOUSERSITE": "1", "PYTEST_ADDOPTS": "--tb=short"}  # fmt: skip


@dataclass
class SuiteRun:
    statuses: dict[str, str]
    output: str
    exit_code: int
    timed_out: bool = False
    cached: bool = field(default=False, compare=False)

    def passed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s == TestStatus.PASSED}

    def killed(self) -> bool:
        """Ended by a signal (a memory limit's SIGKILL: exit 137), not by pytest, which exits
        0-5: its per-test report may be missing, so no test can be told failing from it."""
        return self.exit_code < 0 or self.exit_code >= 128


class SuiteRunner:
    def __init__(
        self,
        backend: SandboxBackend,
        test_cmd: str,
        *,
        mounts: Mapping[str, str] | None = None,
        python_env: str | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self.backend = backend
        self.test_cmd = test_cmd
        self.python_env = python_env
        self.mounts = dict(mounts or {})
        self.timeout_s = timeout_s
        self.cache_dir = cache_root() / RUNS_DIR
        self._digests: dict[Path, str] = {}

    @property
    def install_config(self) -> dict[str, str]:
        """The `install_config` of the tasks this runner's results make."""
        config = {"test_cmd": self.test_cmd, "log_parser": "pytest"}
        return {**config, "python_env": self.python_env} if self.python_env else config

    def key(self, tree: Path, overrides: Mapping[str, str | None]) -> str:
        if tree not in self._digests:
            self._digests[tree] = tree_digest(tree)
        material = json.dumps([self._digests[tree], sorted(overrides.items()), self.test_cmd])
        return hashlib.sha256(material.encode()).hexdigest()

    def run(self, tree: Path, overrides: Mapping[str, str | None] | None = None) -> SuiteRun:
        overrides = dict(overrides or {})
        cached = self.cache_dir / f"{self.key(tree, overrides)}.json"
        if cached.is_file():
            return SuiteRun(**json.loads(cached.read_text()), cached=True)
        run = self._run(tree, overrides)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        if not run.timed_out:  # a timeout may be the loaded machine's fault: run it again later
            scratch = cached.with_suffix(f".{id(run)}.tmp")
            scratch.write_text(json.dumps({k: v for k, v in asdict(run).items() if k != "cached"}))
            scratch.replace(cached)
        return run

    def _run(self, tree: Path, overrides: dict[str, str | None]) -> SuiteRun:
        with tempfile.TemporaryDirectory(prefix="harness-gym-mine-") as scratch:
            repo = Path(scratch) / "repo"
            shutil.copytree(tree, repo, symlinks=True,
                            ignore=shutil.ignore_patterns(*IGNORED_DIRS, "*.pyc"))  # fmt: skip
            for path, text in overrides.items():
                target = repo / path
                if text is None:
                    target.unlink(missing_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
            spec = SandboxSpec(repo=repo, label="mine", ro_mounts=self.mounts)
            with self.backend.create(spec) as sandbox:
                result = sandbox.exec(self.test_cmd, env=RUN_ENV, timeout=self.timeout_s)
        output = result.stdout + "\n" + result.stderr
        if len(output) > HEAD_CHARS + TAIL_CHARS:
            output = output[:HEAD_CHARS] + "\n[...]\n" + output[-TAIL_CHARS:]
        statuses = {t: str(s) for t, s in get_log_parser("pytest")(result.stdout).items()}
        return SuiteRun(statuses, output, result.exit_code, result.timed_out)


_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$", re.MULTILINE)


def failure_excerpt(output: str, test: str, *, hide: tuple[str, ...] = (), lines: int = 8) -> str:
    """The `E ...` lines pytest printed for `test` (its assertion or exception), without any
    line holding one of `hide` (the changed source line must never reach a statement)."""
    name = test.split("::", 1)[-1].replace("::", ".")
    sections = _SECTION.split(output)
    for title, body in zip(sections[1::2], sections[2::2], strict=False):
        if title.strip() != name:
            continue
        picked = [
            line.rstrip() for line in body.splitlines()
            if line.startswith("E ") and not any(h and h in line for h in hide)
        ]  # fmt: skip
        return "\n".join(picked[:lines])
    return ""
