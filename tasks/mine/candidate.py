"""One mined task before it is written: its files, its rows, its statement and difficulty.

A `Candidate` is the tree before the fix (`tree` plus `overrides`: the mutant's file, or
nothing for a commit's parent), the gold `patch` and `test_patch`, FAIL_TO_PASS/PASS_TO_PASS and
what it is about (`meta`: kind, files, functions, split unit). `write(folder)` lays it out as a
task directory (`task.json` with SWE-rebench V2 fields plus `mine`, and `repo/`).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .project import IGNORED_DIRS

__all__ = ["Candidate", "changed_lines", "difficulty", "leak_fragments", "leaks", "scrub",
           "symptom_statement"]

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


def _pairs(patch: str) -> list[tuple[str, str]]:
    """(removed line, added line) pairs: each run of `-` lines zipped with the `+` run after."""
    pairs: list[tuple[str, str]] = []
    removed: list[str] = []
    added: list[str] = []
    for line in [*patch.splitlines(), " "]:
        if line.startswith(("+++", "---")):
            continue
        if line[:1] == "-" and not added:
            removed.append(line[1:])
        elif line[:1] == "+":
            added.append(line[1:])
        else:
            pairs += zip(removed, added, strict=False)
            removed, added = ([line[1:]] if line[:1] == "-" else []), []
    return pairs


def _core(text: str, start: int, end: int) -> str:
    """`text[start:end]` widened to whole whitespace-separated tokens, and by one more token on
    each side while it is shorter than 4 characters (`1` in `i + 1]` becomes `+ 1]`)."""
    for _ in range(2):
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        while end < len(text) and not text[end].isspace():
            end += 1
        if len(text[start:end].strip()) >= 4:
            break
        start = len(text[:start].rstrip())
        end = len(text) - len(text[end:].lstrip())
    return text[start:end].strip()


def leak_fragments(patch: str) -> list[str]:
    """What a statement must never show of the fix: each changed line, and each part of a
    changed line that differs from its counterpart (the mutated token, widened to whole tokens).
    Parts that are a bare word or number (`None`, `count`, `2`) are left out: they are what the
    tests print about behaviour (`assert None == 'x'`), too common to tell where the change
    is. Only Python files count: a release's changelog lines are what its statement quotes."""
    patch = _python_part(patch)
    found = {line for line in changed_lines(patch) if len(line) >= 4 and not _word(line)}
    for old, new in _pairs(patch):
        prefix = len(_common_prefix(old, new))
        suffix = len(_common_prefix(old[prefix:][::-1], new[prefix:][::-1]))
        for text in (old, new):
            part = _core(text, prefix, len(text) - suffix)
            if len(part) >= 4 and not _word(part):
                found.add(part)
    return sorted(found, key=len, reverse=True)


def _python_part(patch: str) -> str:
    """The sections of a `diff --git` patch whose file is a `.py` (all of a bare diff)."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    if len(sections) == 1:
        return patch
    return "".join(s for s in sections
                   if s.startswith("diff --git ") and s.split("\n", 1)[0].endswith(".py"))


def _word(text: str) -> bool:
    return text.replace("_", "a").isalnum()


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def leaks(text: str, patch: str) -> list[str]:
    """The fragments of the fix (`leak_fragments`) that `text` shows."""
    return [part for part in leak_fragments(patch) if part in text]


def scrub(text: str, patch: str) -> str:
    """`text` without the lines that show a fragment of the fix (a commit message quoting it)."""
    hide = leak_fragments(patch)
    return "\n".join(line for line in text.splitlines() if not any(h in line for h in hide))


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
