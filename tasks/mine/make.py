"""`make_tasks`: mine a package or a repository into a validated task directory.

    summary = make_tasks(pypi="inflection==0.5.1", n=20, out=Path("mined"))
    summary = make_tasks(git=Path("~/src/mylib"), since="v1.0", n=20, out=Path("mined"))
    summary = make_tasks(git=[Path("~/src/a"), Path("~/src/b")], n=20, out=Path("suite"))
    load_tasks("mined")   # what `tasks="mined"` runs

Each candidate (a mutant, a commit) is run against the suite in the sandbox; one that makes a
task is written to `OUT/.staging-<id>/`, validated there like the built-ins (`validate_task`:
the gold patch passes, the unfixed repo fails FAIL_TO_PASS and passes PASS_TO_PASS, on the
backend the tasks will run on; each side `VALIDATION_RUNS` times, a test changing status between
them is `flaky`) and only then renamed to `OUT/<id>/`, so a folder there is always a valid task.
A re-run skips the tasks already written and reads every suite run back from the cache
(`runs`), so a stopped run resumes where it was. `OUT/split.json` holds the train/held-out
split (`split`), `OUT/mining.json` the summary. Several repositories go into one
directory with their candidates taken in turn (`several`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...sandbox import default_sandbox, load_sandbox
from ...sandbox.base import SandboxBackend
from ..loader import load_tasks
from ..validation import TaskValidation, validate_task
from .candidate import Candidate, leaks
from .envs import python_env
from .history import HistorySource
from .inject import MutationSource
from .project import Project, ProjectError, scan_project
from .pypi import cached_sdist, parse_pin, test_requirements
from .runs import SuiteRunner
from .several import Sources
from .split import heldout_units, split_of, write_split

__all__ = ["MiningSummary", "make_tasks"]

SUMMARY_FILE = "mining.json"
# A gold patch longer than this is no task to learn from in one episode (a release rewriting
# a module), and the oracle cannot send it in one answer within a CLI's 4096-token output
# limit (Pi cut a 7.6 KB patch): `--max-patch-lines` raises it.
MAX_PATCH_LINES = 120
# Each kept task is graded this many times with its fix and as many without, in fresh
# sandboxes; a test whose status changes between them rejects it as `flaky` (cachetools
# 7.1.7's `RRCache` test, random eviction, was kept in 2 of 3 runs when each side ran once).
# A flake rarer than that can still pass: more runs cost a suite run each.
VALIDATION_RUNS = 2


@dataclass
class MiningSummary:
    source: str
    out: str
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    resumed: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)  # invalid or flaky task -> why
    split: dict[str, int] = field(default_factory=dict)
    by_repo: dict[str, int] = field(default_factory=dict)  # tasks in `out` per source repository

    def describe(self) -> str:
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"
        split = ", ".join(f"{k} {v}" for k, v in self.split.items())
        repos = ", ".join(f"{k} {v}" for k, v in sorted(self.by_repo.items()))
        return (f"{self.source}: {self.candidates} candidates, {self.tried} tried, "
                f"{self.kept} kept ({self.resumed} already written); rejected: {rejected}; "
                f"split: {split}; by repo: {repos or 'none'}; tasks in {self.out}")  # fmt: skip


def make_tasks(
    *,
    out: Path,
    n: int,
    pypi: str | None = None,
    git: Path | str | Sequence[Path | str] | None = None,
    since: str | None = None,
    seed: int = 0,
    sandbox: str | SandboxBackend | None = None,
    progress: bool = True,
    timeout_s: float = 300.0,
    max_patch_lines: int = MAX_PATCH_LINES,
) -> MiningSummary:
    """Mine up to `n` validated tasks from `pypi` (NAME==VERSION) or `git` (a local repo, or
    several: their candidates taken in turn into one directory)."""
    repos = [git] if isinstance(git, (str, os.PathLike)) else list(git or [])
    if (pypi is None) == (not repos):
        raise ValueError("give exactly one of --pypi NAME==VERSION and --git PATH")
    if n < 1:
        raise ValueError(f"--n must be at least 1, got {n}")
    if since is not None and not repos:
        raise ValueError("--since goes with --git")
    if since is not None and len(repos) > 1:
        raise ValueError("--since names a revision of one repository: give one --git with it")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    backend = load_sandbox(sandbox or default_sandbox())
    source: MutationSource | HistorySource | Sources
    with tempfile.TemporaryDirectory(prefix="harness-gym-mine-") as scratch:
        if pypi is not None:
            source, label = _pypi_source(pypi, backend, seed, timeout_s), pypi
        else:
            paths = [Path(r).expanduser() for r in repos]
            histories = [_git_source(p, since, backend, Path(scratch) / str(i), timeout_s)
                         for i, p in enumerate(paths)]  # fmt: skip
            source = histories[0] if len(histories) == 1 else Sources(histories)
            label = " + ".join(str(r) for r in repos)
        return _mine(source, label, out, n, seed, backend, progress, timeout_s, max_patch_lines)


def _runner(project: Project, backend: SandboxBackend, env: Path, timeout_s: float) -> SuiteRunner:
    python = str(env / "bin" / "python")
    return SuiteRunner(backend, project.test_cmd(python), mounts={str(env): str(env)},
                       python_env=env.name, timeout_s=timeout_s)  # fmt: skip


def _pypi_source(pin: str, backend: SandboxBackend, seed: int, timeout_s: float) -> MutationSource:
    name, version = parse_pin(pin)
    root = cached_sdist(pin)
    project = scan_project(root, name)
    env = python_env(f"{name}-{version}", test_requirements(root), backend)
    runner = _runner(project, backend, env, timeout_s)
    baseline = runner.run(project.root)
    if not baseline.passed():
        raise ProjectError(f"{pin}: no test passes before any change, so no bug can be seen "
                           f"(exit {baseline.exit_code}): {baseline.output[-800:]}")  # fmt: skip
    return MutationSource(project, runner, baseline, repo=f"pypi/{name}-{version}",
                          install_config=runner.install_config, seed=seed)  # fmt: skip


def _git_source(path: Path, since: str | None, backend: SandboxBackend, scratch: Path,
                timeout_s: float) -> HistorySource:  # fmt: skip
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", path.resolve().name) or "repo"
    runners: dict[str, SuiteRunner] = {}

    def runner_for(project: Project) -> SuiteRunner:
        # Built on the first commit that needs a run: a path that is no repository, or a
        # history with no candidate, builds nothing.
        env = python_env(label, test_requirements(path), backend)
        runner = _runner(project, backend, env, timeout_s)
        return runners.setdefault(runner.test_cmd, runner)

    return HistorySource(path, runner_for, since=since, label=label, scratch=scratch)


def _existing(out: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/task.json")}


def _duplicate_keys(row: dict[str, Any]) -> list[str]:
    """Two tasks are one when their fixes change the same lines the same way (context and blob
    ids aside: a fix reverted and made again later in a history), or when they break the same
    function the same way as far as the suite's own tests tell (the same FAIL_TO_PASS). Not so
    with a test patch: two commits to one function whose new assertions extend the same test
    are two fixes with one FAIL_TO_PASS name."""
    lines = row["patch"].splitlines()
    change = json.dumps([x for x in lines if x[:1] in "+-" and not x.startswith(("+++ ", "--- "))])
    if not row["mine"].get("functions") or row["test_patch"]:
        return [change]
    return [change, json.dumps([row["mine"]["functions"], sorted(row["FAIL_TO_PASS"])])]


def _mine(source: Any, label: str, out: Path, n: int, seed: int, backend: SandboxBackend,
          progress: bool, timeout_s: float, max_patch_lines: int) -> MiningSummary:  # fmt: skip
    from tqdm import tqdm

    items = source.items()
    heldout = heldout_units((u for item in items for u in source.units(item)), seed=seed)
    existing = _existing(out)
    seen = {key for row in existing.values() for key in _duplicate_keys(row)}
    summary = MiningSummary(label, str(out), candidates=len(items))
    rejected: Counter[str] = Counter(getattr(source, "rejected_upfront", []))
    summary.candidates += sum(rejected.values())
    with tqdm(total=min(n, len(items)), desc=f"mining {label}", unit="task",
              disable=not progress) as bar:  # fmt: skip
        for item in items:
            if summary.kept >= n:
                break
            if source.instance_id(item) in existing:
                summary.kept += 1
                summary.resumed += 1
                bar.update()
                continue
            summary.tried += 1
            result = source.evaluate(item)
            if isinstance(result, str):
                rejected[result] += 1
                bar.set_postfix(tried=summary.tried)
                continue
            if len(result.patch.splitlines()) > max_patch_lines:
                rejected["patch_too_large"] += 1
                continue
            if leaks(result.problem_statement, result.patch):
                rejected["leaky_statement"] += 1  # a test name quoting the fix, say
                continue
            keys = _duplicate_keys(result.row())
            if any(key in seen for key in keys):
                rejected["duplicate"] += 1
                continue
            units = source.units(item)
            result.meta.update(split=split_of(units, heldout), units=units)
            report = _write_validated(result, out, backend, timeout_s)
            if not report.ok:
                rejected["flaky" if report.flaky else "invalid"] += 1
                summary.problems[result.instance_id] = report.problems
                continue
            seen.update(keys)
            summary.kept += 1
            bar.update()
            bar.set_postfix(tried=summary.tried)
    summary.rejected = dict(rejected)
    split = write_split(out, unit=source.unit, heldout=heldout, seed=seed)
    summary.split = {k: len(split[k]) for k in ("train", "heldout", "mixed")}
    summary.by_repo = dict(Counter(row["repo"] for row in _existing(out).values()))
    (out / SUMMARY_FILE).write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def _write_validated(candidate: Candidate, out: Path, backend: SandboxBackend,
                     timeout_s: float) -> TaskValidation:  # fmt: skip
    """Write the task to a staging folder, validate it there, then move it into `out`."""
    staging = out / f".staging-{candidate.instance_id}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        candidate.write(staging)
        (task,) = load_tasks(staging)
        report = validate_task(task, backend, runs=VALIDATION_RUNS, check_unfixed=True,
                               unfixed_runs=VALIDATION_RUNS, timeout_s=timeout_s)  # fmt: skip
        if report.ok:
            staging.rename(out / candidate.instance_id)
        return report
    finally:
        shutil.rmtree(staging, ignore_errors=True)


