"""Cached Python environments for mined tasks, and the read-only mounts that show them to a
sandbox.

A mined package's tests need its dependencies (and pytest), which the harness-gym interpreter
may not have. `python_env(key, requirements)` makes a venv from the registry once, under
`$HARNESS_GYM_CACHE/mine-env-<key>` (atomic: `build_once`), without the package itself, so its
tests import the repository's source, which the agent edits. A task names its env in
`install_config.python_env` and runs `<env>/bin/python -m pytest`; `env_mounts(task)` is what
the episode and `validate_task` add to `SandboxSpec.ro_mounts` (bwrap sees nothing of the host's
cache otherwise). Read-only: an agent cannot plant a plugin in the interpreter that grades it.
Only such cache directories are mounted: a task file cannot expose the host.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ...engines._cache import build_once, cache_root
from ..task import Task, TaskError

__all__ = ["ENV_PREFIX", "EnvBuildError", "env_key", "env_mounts", "python_env"]

ENV_PREFIX = "mine-env-"
PIP_TIMEOUT_S = 900


class EnvBuildError(RuntimeError):
    """pip could not install a mined package's dependencies from the registry."""


def env_key(label: str, requirements: Sequence[str]) -> str:
    """A cache name for `requirements` on this Python: `<label>-<digest>`."""
    digest = hashlib.sha256(
        "\n".join([sys.version.split()[0], *sorted(set(requirements))]).encode()
    ).hexdigest()[:10]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', label)}-{digest}"


def python_env(label: str, requirements: Sequence[str]) -> Path:
    """The venv holding `requirements` (pytest always), built once from the registry."""
    wanted = sorted({"pytest", *requirements})
    return build_once(f"{ENV_PREFIX}{env_key(label, wanted)}", lambda out: _build(out, wanted))


def _build(out: Path, requirements: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(out)], check=True,
                   capture_output=True)  # fmt: skip
    pip = [sys.executable, "-m", "pip", "--python", str(out / "bin" / "python"), "install",
           "--quiet", "--disable-pip-version-check", *requirements]  # fmt: skip
    try:
        done = subprocess.run(pip, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise EnvBuildError(f"pip install {' '.join(requirements)} ran past {PIP_TIMEOUT_S}s")
    if done.returncode != 0:
        raise EnvBuildError(
            f"pip install {' '.join(requirements)} failed: {done.stderr.strip()[-1500:]}"
        )


def env_mounts(task: Task) -> dict[str, str]:
    """`{host path: sandbox path}` for the task's cached env (empty when it names none)."""
    named = task.install_config.get("python_env")
    if not named:
        return {}
    root = cache_root().resolve()
    path = (root / str(named)).resolve()
    if path.parent != root or not path.name.startswith(ENV_PREFIX):
        raise TaskError(
            f"task {task.instance_id!r}: install_config.python_env {named!r} is not the name "
            f"of a {ENV_PREFIX}* directory in {root}"
        )
    if not path.is_dir():
        raise TaskError(
            f"task {task.instance_id!r}: its python env {path} is missing: re-run "
            "`harness-gym tasks make` with the same arguments on this machine to build it"
        )
    return {os.fspath(path): os.fspath(path)}
