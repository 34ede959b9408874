"""Tasks from a repository's own history, by SWE-bench's rule.

`HistorySource` walks the first-parent, non-merge commits of `PATH` (after `--since REV` when
given). A commit is a candidate when it changes both test files and library source. Its parent
tree with the commit's test files is run (`before`), then the commit's tree (`after`): tests
that pass after and did not pass before are FAIL_TO_PASS (a new test that did not exist counts:
it could not pass), tests that pass in both are PASS_TO_PASS. A commit whose tests fail on
neither side (a refactor with tests that always passed) is rejected, and so is one whose suite
was killed on either side (no per-test report to tell which tests failed). The repository is the
parent tree, the gold patch the commit's diff but tests and docs (changelog, README, `docs/`:
nothing the tests exercise), the test patch its test diff; the statement is the commit message
and how the new tests fail.

A commit's split units are the functions its library changes touch (`functions`:
`path::qualname`, `path::<module>` for code outside any def): split by file, every release of
parse (one module) and most of cachetools (`__init__.py`) shared one unit, and the held-out
split of both histories was empty.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..loader import GIT_ISOLATION
from ..test_scope import is_test_file
from .candidate import Candidate, difficulty, leak_fragments, scrub, symptom_statement
from .functions import changed_units
from .project import ProjectError, is_docs_path, is_library_path, scan_project
from .runs import SuiteRunner, failure_excerpt

__all__ = ["Commit", "GitError", "HistorySource", "git"]


class GitError(ValueError):
    """The path is not a git repository, or a git command failed."""


def git(repo: Path, *args: str, binary: bool = False, env: Mapping[str, str] | None = None) -> Any:
    try:
        done = subprocess.run(["git", "-c", "core.quotepath=off", *args], cwd=repo,
                              env={**os.environ, **GIT_ISOLATION, **(env or {})},
                              capture_output=True, check=True)  # fmt: skip
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    except subprocess.CalledProcessError as error:
        raise GitError(f"git {' '.join(args)} failed in {repo}: "
                       f"{error.stderr.decode(errors='replace').strip()}") from None  # fmt: skip
    return done.stdout if binary else done.stdout.decode(errors="replace")


def is_test_path(path: str) -> bool:
    parts = path.split("/")
    return is_test_file(parts[-1]) or any(p in ("tests", "test", "testing") for p in parts[:-1])


@dataclass(frozen=True)
class Commit:
    sha: str
    parent: str
    message: str
    tests: list[str]
    sources: list[str]
    fix: list[str]  # what the gold patch holds: every changed path but tests and docs


class HistorySource:
    unit = "function"

    def __init__(self, repo: Path, runner_for: Any, *, since: str | None, label: str,
                 scratch: Path) -> None:  # fmt: skip
        self.path = Path(repo)
        if not (self.path / ".git").exists():
            raise GitError(f"{self.path} is not a git repository (no .git)")
        self.label, self.scratch, self.runner_for = label, scratch, runner_for
        self.scratch.mkdir(parents=True, exist_ok=True)
        span = f"{since}..HEAD" if since else "HEAD"
        shas = git(self.path, "rev-list", "--reverse", "--first-parent", "--no-merges",
                   span).split()  # fmt: skip
        self.rejected_upfront: list[str] = []
        self._items: list[Commit] = []
        self._units: dict[str, list[str]] = {}
        for sha in shas:
            parents = git(self.path, "rev-list", "--parents", "-n1", sha).split()[1:]
            if len(parents) != 1:
                continue  # the root commit has nothing before it
            names = git(self.path, "diff", "--name-only", "--no-renames", parents[0], sha)
            changed = [p for p in names.split("\n") if p]
            tests = [p for p in changed if is_test_path(p)]
            # setup.py or docs/conf.py is no code to learn from (nor a split unit)
            sources = [p for p in changed if is_library_path(p) and not is_test_path(p)]
            if not tests or not sources:
                self.rejected_upfront.append("no_tests" if not tests else "no_source")
                continue
            message = git(self.path, "log", "-1", "--format=%B", sha).strip()
            fix = [p for p in changed if not is_test_path(p) and not is_docs_path(p)]
            self._items.append(Commit(sha, parents[0], message, tests, sources, fix))

    def items(self) -> list[Commit]:
        return self._items

    def units(self, commit: Commit) -> list[str]:
        """The functions (`path::qualname`) and module code (`path::<module>`) of the library
        files the commit changes (`functions.changed_units`)."""
        if commit.sha not in self._units:
            diff = git(self.path, "diff", "-U0", "--no-color", "--no-ext-diff", "--no-renames",
                       "--src-prefix=a/", "--dst-prefix=b/", commit.parent, commit.sha, "--",
                       *commit.sources)  # fmt: skip
            old = {p: self._text(commit.parent, p) for p in commit.sources}
            new = {p: self._text(commit.sha, p) for p in commit.sources}
            self._units[commit.sha] = changed_units(diff, old, new)
        return list(self._units[commit.sha])

    def _text(self, sha: str, path: str) -> str | None:
        try:
            return git(self.path, "show", f"{sha}:{path}")
        except GitError:
            return None  # added or deleted by the commit

    def instance_id(self, commit: Commit) -> str:
        return f"{self.label}__{commit.sha[:12]}"

    def _tree(self, sha: str) -> Path:
        folder = self.scratch / sha
        if not folder.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=self.scratch))
            archive = git(self.path, "archive", "--format=tar", sha, binary=True)
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            tmp.rename(folder)
        return folder

    def evaluate(self, commit: Commit) -> Candidate | str:
        parent, after = self._tree(commit.parent), self._tree(commit.sha)
        try:
            project = scan_project(after, self.label)
        except ProjectError:
            return "no_suite"  # this commit's tree has no test files or no library left
        runner: SuiteRunner = self.runner_for(project)
        test_files = {p: ((after / p).read_text() if (after / p).is_file() else None)
                      for p in commit.tests}  # fmt: skip
        before_run = runner.run(parent, test_files)
        after_run = runner.run(after)
        if before_run.timed_out or after_run.timed_out:
            return "timeout"
        if before_run.killed() or after_run.killed():
            # cachetools 7.3.3's new test loops forever on 7.3.2, growing a list until the
            # sandbox's memory limit kills the suite: no report, so every test looked like a
            # FAIL_TO_PASS, and each unsolved episode would cost the whole test timeout
            return "killed"
        fixed = sorted(after_run.passed() - before_run.passed())
        if not fixed:
            return "no_fail_to_pass"  # the new tests pass without the change too
        kept = sorted(after_run.passed() & before_run.passed())
        # Docs and changelog stay as they were: a release's gold patch is its code, which an
        # agent (or the oracle, in one answer) can write.
        patch = git(self.path, "diff", "--no-color", "--no-ext-diff", "--full-index", "--binary",
                    commit.parent, commit.sha, "--", *commit.fix)  # fmt: skip
        test_patch = git(self.path, "diff", "--no-color", "--no-ext-diff", "--full-index",
                         "--binary", commit.parent, commit.sha, "--", *commit.tests)  # fmt: skip
        hide = tuple(leak_fragments(patch))
        excerpt = failure_excerpt(before_run.output, fixed[0], hide=hide)
        # The authors' message may quote the fix ("use `<=` in ..."): those lines go.
        statement = symptom_statement(scrub(commit.message, patch), fixed, excerpt, len(kept),
                                      fixed[0])  # fmt: skip
        kind = "commit"
        meta = {"source": "history", "kind": kind, "commit": commit.sha,
                "files": list(commit.sources), "functions": self.units(commit),
                "difficulty": difficulty(len(fixed), patch, kind)}  # fmt: skip
        install_config = runner.install_config
        return Candidate(self.instance_id(commit), self.label, parent, {}, patch, test_patch,
                         fixed, kept, statement, install_config, meta)  # fmt: skip
