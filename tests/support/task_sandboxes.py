"""Test-only helpers for the task and grader tests: a task's repo in a real sandbox (`local`
unless a backend is given; `support.grading` builds the grader tests' steps on it).

The sandbox runs the task's own test command, so `python` in it must be this interpreter (the
one with pytest): its directory goes first on the sandbox's PATH.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness_gym.tasks import Task, materialize

from harness_gym.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from harness_gym.sandbox.local import LocalSandboxBackend

PYTHON_PATH_ENV = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@contextmanager
def task_sandbox(task: Task, scratch: Path, backend: SandboxBackend | None = None, *,
                 repo_name: str | None = None, label: str = "tasks-test",
                 **spec: Any) -> Iterator[Sandbox]:
    """A fresh sandbox holding `task`'s materialized repo at its base commit, in
    `scratch`/`repo_name` (default: `<instance id>-repo`); `spec`: more SandboxSpec fields."""
    repo = scratch / (repo_name or f"{task.instance_id}-repo")
    repo.parent.mkdir(parents=True, exist_ok=True)
    materialize(task, repo)
    backend = LocalSandboxBackend() if backend is None else backend
    fields = {"env": PYTHON_PATH_ENV, **spec}
    with backend.create(SandboxSpec(repo=repo, label=label, **fields)) as box:
        yield box


def write(sandbox: Sandbox, path: str, text: str) -> None:
    """Edit a repo file as an agent would, through the sandbox (`path` relative to the repo)."""
    sandbox.write_file(f"{sandbox.workdir}/{path}", text)


def read(sandbox: Sandbox, path: str) -> str:
    return sandbox.read_file(f"{sandbox.workdir}/{path}").decode()
