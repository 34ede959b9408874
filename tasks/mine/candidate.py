"""One mined task before it is written: its files, its rows, its statement and difficulty.

A `Candidate` is the tree before the fix (`tree` plus `overrides`: the mutant's file, or
nothing for a commit's parent), the gold `patch` and `test_patch`, FAIL_TO_PASS/PASS_TO_PASS and
what it is about (`meta`: kind, files, functions, split unit). `write(folder)` lays it out as a
task directory (`task.json` with SWE-rebench V2 fields plus `mine`, and `repo/`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .project import IGNORED_DIRS

__all__ = ["Candidate", "changed_lines", "difficulty", "symptom_statement"]

HARD_KINDS = frozenset({"drop_statement", "drop_branch", "swap_arguments", "return_none"})


@dataclass
class Candidate:
    instance_id: str
    repo: str
    tree: Path
    overrides: dict[str, str | None]
    patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    problem_statement: str
    install_config: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "problem_statement": self.problem_statement,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "FAIL_TO_PASS": self.fail_to_pass,
            "PASS_TO_PASS": self.pass_to_pass,
            "install_config": self.install_config,
            "mine": self.meta,
        }

    def write(self, folder: Path) -> None:
        repo = folder / "repo"
        shutil.copytree(self.tree, repo, symlinks=True,
                        ignore=shutil.ignore_patterns(*IGNORED_DIRS, "*.pyc"))  # as the suite ran
        for path, text in self.overrides.items():
            if text is None:
                (repo / path).unlink(missing_ok=True)
            else:
                (repo / path).write_text(text)
        (folder / "task.json").write_text(json.dumps(self.row(), indent=2) + "\n")


def changed_lines(patch: str) -> list[str]:
    """The text of every added or removed line of a diff (stripped, non-empty)."""
    return [
        line[1:].strip() for line in patch.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()
    ]  # fmt: skip


def difficulty(n_fail_to_pass: int, patch: str, kind: str) -> dict[str, Any]:
    """A rough estimate: fewer failing tests, a bigger fix and a kind that removes code (nothing
    left to stare at) each make a task harder."""
    lines = len(changed_lines(patch))
    score = 1 + (n_fail_to_pass <= 1) + (lines > 4) + (kind in HARD_KINDS)
    level = "easy" if score <= 1 else "medium" if score == 2 else "hard"
    return {"level": level, "score": score, "fail_to_pass": n_fail_to_pass,
            "diff_lines": lines, "kind": kind}  # fmt: skip


def symptom_statement(
    subject: str, failing: list[str], excerpt: str, n_passing: int, first: str
) -> str:
    """A bug report from the outside: which tests fail and how, never where or why."""
    shown = failing[:10]
    more = f"  ... and {len(failing) - len(shown)} more\n" if len(failing) > len(shown) else ""
    text = (
        f"{subject}\n\n{len(failing)} test(s) fail:\n\n"
        + "".join(f"  - {test}\n" for test in shown) + more
    )
    if excerpt:
        text += f"\n`{first}` fails with:\n\n```\n{excerpt}\n```\n"
    text += (
        f"\nThe other {n_passing} test(s) of the suite pass. The tests are correct: fix the "
        "library code so that the failing tests pass too.\n"
    )
    return text
