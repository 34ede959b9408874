"""Cached Python environments for mined tasks, and the read-only mounts that show them to a
sandbox.

A mined package's tests need its dependencies (and pytest), which the sandbox's interpreter may
not have. `python_env(label, requirements, backend)` makes a venv from the registry once, under
`$HARNESS_GYM_CACHE/mine-env-<key>` (atomic: `build_once`), without the package itself, so its
tests import the repository's source, which the agent edits. Whose interpreter it is depends on
where the tests will run: the host's for `bwrap` and `local` (they see the host's files), the
image's for `docker` (`image_env`: built in a container of the image, keyed by its id). The env
holds a marker (`harness-gym-env.json`) saying which.

A task names its env in `install_config.python_env` and runs `<env>/bin/python -m pytest`;
`env_mounts(task, backend)` is what the episode and `validate_task` add to
`SandboxSpec.ro_mounts` (the sandbox sees nothing of the host's cache otherwise), after checking
that the env was built for that backend's interpreter. Read-only: an agent cannot plant a plugin
in the interpreter that grades it. Only such cache directories are mounted: a task file cannot
expose the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...engines._cache import build_once, cache_root
from ...sandbox.base import SandboxBackend
from ..task import Task, TaskError

__all__ = ["ENV_PREFIX", "EnvBuildError", "env_key", "env_mounts", "env_runtime", "python_env"]

ENV_PREFIX = "mine-env-"
MARKER = "harness-gym-env.json"
HOST_BACKENDS = ("bwrap", "local")  # sandboxes that see the host's interpreter at its path
PIP_TIMEOUT_S = 900


class EnvBuildError(RuntimeError):
    """pip could not install a mined package's dependencies from the registry."""


def env_key(label: str, requirements: Sequence[str], salt: str) -> str:
    """A cache name for `requirements` on one interpreter (`salt`): `<label>-<digest>`."""
    digest = hashlib.sha256("\n".join([salt, *sorted(set(requirements))]).encode()).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', label)}-{digest[:10]}"


def env_runtime(backend: SandboxBackend, image: str | None = None) -> dict[str, str]:
    """Whose interpreter `backend`'s sandboxes run a mined task's tests with: the host's, or
    that of `image` (default: the backend's) for a backend that runs images."""
    if backend.runs_images:
        from .image_env import ImageEnvError, image_id

        name = image or str(getattr(backend, "image"))
        try:
            return {"runtime": "image", "image": name, "image_id": image_id(name)}
        except ImageEnvError as error:
            raise EnvBuildError(str(error)) from None
    if backend.name in HOST_BACKENDS:
        return {"runtime": "host"}
    raise EnvBuildError(
        f"mined tasks run their tests with a cached env mounted into the sandbox: "
        f"{', '.join(HOST_BACKENDS)} and docker can, the {backend.name!r} sandbox cannot"
    )


def python_env(label: str, requirements: Sequence[str], backend: SandboxBackend) -> Path:
    """The venv holding `requirements` (pytest always) for `backend`'s interpreter, built once
    from the registry."""
    wanted = sorted({"pytest", *requirements})
    runtime = env_runtime(backend)
    if runtime["runtime"] == "host":
        key = env_key(label, wanted, salt=sys.version.split()[0])  # the key of earlier caches
        marker = {**runtime, "python": platform.python_version()}

        def build(out: Path) -> None:
            _build_host(out, wanted)
            (out / MARKER).write_text(json.dumps(marker) + "\n")
    else:
        from .image_env import build_image_env, probe

        key = env_key(label, wanted, salt=runtime["image_id"])

        def build(out: Path) -> None:
            python = probe(runtime["image"])
            build_image_env(out, python, wanted)
            (out / MARKER).write_text(json.dumps({**runtime, "python": python.version}) + "\n")

    return build_once(f"{ENV_PREFIX}{key}", build)


def _build_host(out: Path, requirements: list[str]) -> None:
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


def _built_for(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((path / MARKER).read_text()))
    except FileNotFoundError:
        return {"runtime": "host"}  # made before envs carried a marker: all were the host's
    except (OSError, ValueError):
        return {}


def _describe(runtime: dict[str, Any]) -> str:
    if runtime.get("runtime") == "image":
        return f"docker image {runtime.get('image')} ({str(runtime.get('image_id'))[:19]})"
    return "this host's interpreter" if runtime.get("runtime") == "host" else "an unknown Python"


def env_mounts(task: Task, backend: SandboxBackend) -> dict[str, str]:
    """`{host path: sandbox path}` for the task's cached env (empty when it names none), once
    it is known to be built for the interpreter `backend` runs it with."""
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
    try:
        wanted = env_runtime(backend, task.image_name)
    except EnvBuildError as error:
        raise TaskError(f"task {task.instance_id!r}: {error}") from None
    built = _built_for(path)
    if (built.get("runtime"), built.get("image_id")) != (wanted["runtime"], wanted.get("image_id")):
        raise TaskError(
            f"task {task.instance_id!r} was mined for {_describe(built)}, but the "
            f"{backend.name!r} sandbox runs {_describe(wanted)}: mine it again with "
            f"`harness-gym tasks make ... --sandbox {backend.name}`"
        )
    return {os.fspath(path): os.fspath(path)}
