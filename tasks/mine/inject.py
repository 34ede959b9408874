"""Bug injection into a real package: mutants of its functions that its own suite catches.

`MutationSource` lists the mutants of every library module (`mutate.mutants`), interleaved by
function in a seeded order (so `--n 20` spreads over the code rather than 20 bugs in one
function), and turns one into a `Candidate` by running the suite on it: the tests that passed on
the original and fail on the mutant are FAIL_TO_PASS, those that still pass are PASS_TO_PASS.
The repository is the mutant; the gold patch is the inverse diff (mutant -> original); the test
patch is empty (the suite already holds the tests that catch the bug).
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from typing import Any

from ..family.suite import unified_diff
from .candidate import Candidate, difficulty, leak_fragments, symptom_statement
from .mutate import Mutant, mutants
from .project import Project
from .runs import SuiteRun, SuiteRunner, failure_excerpt

__all__ = ["MutationSource"]


class MutationSource:
    def __init__(self, project: Project, runner: SuiteRunner, baseline: SuiteRun, *,
                 repo: str, install_config: dict[str, Any], seed: int) -> None:  # fmt: skip
        self.project, self.runner, self.baseline = project, runner, baseline
        self.repo, self.install_config, self.seed = repo, install_config, seed
        sources = {path: (project.root / path).read_text(encoding="utf-8", errors="replace")
                   for path in project.sources}  # fmt: skip
        self.originals = sources
        by_function: dict[tuple[str, str], list[Mutant]] = defaultdict(list)
        for path, text in sources.items():
            for mutant in mutants(path, text):
                by_function[(mutant.path, mutant.function)].append(mutant)
        self.unit = "file" if len({path for path, _ in by_function}) > 1 else "function"
        rng = random.Random(f"mine:{seed}")
        groups = [by_function[key] for key in sorted(by_function)]
        for group in groups:
            rng.shuffle(group)
        rng.shuffle(groups)
        self._items = [group[i] for i in range(max(map(len, groups), default=0))
                       for group in groups if i < len(group)]  # fmt: skip

    def items(self) -> list[Mutant]:
        return self._items

    def units(self, mutant: Mutant) -> list[str]:
        return [mutant.path if self.unit == "file" else f"{mutant.path}::{mutant.function}"]

    def instance_id(self, mutant: Mutant) -> str:
        digest = hashlib.sha256(mutant.source.encode()).hexdigest()[:10]
        return f"{self.repo.replace('/', '__')}__mut-{digest}"

    def evaluate(self, mutant: Mutant) -> Candidate | str:
        run = self.runner.run(self.project.root, {mutant.path: mutant.source})
        if run.timed_out:
            return "timeout"
        before = self.baseline.passed()
        after = run.passed()
        failing = sorted(before - after)
        if not failing:
            return "survived"  # no test sees the bug
        still = sorted(before & after)
        if not still:
            return "breaks_everything"  # an import error, not a bug in a function
        patch = unified_diff(mutant.path, mutant.source, self.originals[mutant.path])
        hide = tuple(leak_fragments(patch))
        excerpt = failure_excerpt(run.output, failing[0], hide=hide)
        statement = symptom_statement(
            f"Tests of {self.project.name} fail after a change to the library", failing,
            excerpt, len(still), failing[0],
        )
        meta = {"source": "mutation", "kind": mutant.kind, "files": [mutant.path],
                "functions": [f"{mutant.path}::{mutant.function}"],
                "difficulty": difficulty(len(failing), patch, mutant.kind)}  # fmt: skip
        return Candidate(self.instance_id(mutant), self.repo, self.project.root,
                         {mutant.path: mutant.source}, patch, "", failing, still, statement,
                         dict(self.install_config), meta)  # fmt: skip
