"""Where the family lives: generated into the cache on first use, validated on request.

The `family` entry point of the `harness_gym.tasks` group (`tasks="family:train"`,
`"family:heldout"`) returns the split's directory under
`$HARNESS_GYM_CACHE/task-family-<version>-<digest>-seed0-200-50/`, generating it once (~1 s; the
directory appears atomically, so concurrent first uses are safe). Nothing generated is shipped:
the generator is deterministic, so the code is the suite.

`validate_family` runs every task through `validate_task` in a real sandbox (the gold patch
passes, the unfixed repo fails FAIL_TO_PASS and passes PASS_TO_PASS) and records each verdict
with the task's base commit in `<split>/validation.json`, so a second run only checks tasks whose
files changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...engines._cache import build_once
from ..task import TaskError
from . import bugs, names, suite, symptom
from .names import SPLITS
from .suite import FAMILY_VERSION, write_family
from .symptom import SYMPTOM_VERSION, write_symptom_family

__all__ = ["DEFAULT_SIZES", "family_dir", "load_family", "load_symptom_family",
           "symptom_dir", "validate_family"]

DEFAULT_SIZES = {"train": 200, "heldout": 50}
VALIDATION_FILE = "validation.json"


def family_dir(*, seed: int = 0, train: int = 200, heldout: int = 50) -> Path:
    """The cached family (both splits) for these parameters, generated if missing. The name
    holds a digest of the generator's source, so a changed generator never reads a stale
    cache."""
    name = f"task-family-{FAMILY_VERSION}-{generator_digest()}-seed{seed}-{train}-{heldout}"
    return build_once(name, lambda out: write_family(out, seed=seed, train=train, heldout=heldout))


def symptom_dir(*, seed: int = 0, train: int = 200, heldout: int = 50) -> Path:
    """The cached symptom tier (both splits), generated if missing (~2 s)."""
    name = (f"task-family-symptom-{SYMPTOM_VERSION}-{generator_digest(symptom)}"
            f"-seed{seed}-{train}-{heldout}")
    return build_once(
        name, lambda out: write_symptom_family(out, seed=seed, train=train, heldout=heldout))


def generator_digest(*extra: Any) -> str:
    """Eight hex digits of the generator's source (the modules that decide a task's content)."""
    digest = hashlib.sha256()
    for module in (names, bugs, suite, *extra):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:8]


def load_family(arg: str = "") -> Path:
    """Entry point for `tasks="family:<split>"` (`family` alone is the training split)."""
    split = arg or "train"
    if split not in SPLITS:
        raise TaskError(f"unknown family split {split!r}: use family:train or family:heldout")
    return family_dir(seed=0, **DEFAULT_SIZES) / split


def load_symptom_family(arg: str = "") -> Path:
    """Entry point for `tasks="family-symptom:<split>"` (the harder tier; `symptom`)."""
    split = arg or "train"
    if split not in SPLITS:
        raise TaskError(f"unknown family-symptom split {split!r}: use family-symptom:train or "
                        "family-symptom:heldout")
    return symptom_dir(seed=0, **DEFAULT_SIZES) / split


def validate_family(
    directory: Path,
    backend: Any = "local",
    *,
    runs: int = 1,
    env: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Validate every task of one split directory; return `{instance_id: verdict}` where a
    verdict holds `base_commit`, `ok` and `problems`. Cached verdicts of unchanged tasks are
    reused. `env` defaults to a PATH whose first `python` is this interpreter (with pytest)."""
    from harness_gym.sandbox import load_sandbox

    from ..loader import load_tasks
    from ..validation import validate_task

    directory = Path(directory)
    cache_file = directory / VALIDATION_FILE
    cached = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    backend = load_sandbox(backend) if isinstance(backend, str) else backend
    env = dict(env) if env is not None else {"PATH": _python_first_path()}
    verdicts: dict[str, dict[str, Any]] = {}
    try:
        for task in load_tasks(directory):
            known = cached.get(task.instance_id)
            if known and known["base_commit"] == task.base_commit and known["runs"] >= runs:
                verdicts[task.instance_id] = known
                continue
            report = validate_task(task, backend, runs=runs, env=env, check_unfixed=True,
                                   timeout_s=120)
            verdicts[task.instance_id] = {"base_commit": task.base_commit, "ok": report.ok,
                                          "problems": report.problems, "runs": runs}
            # Written after every task: a long run that is stopped keeps what it checked.
            cache_file.write_text(json.dumps({**cached, **verdicts}, indent=1, sort_keys=True))
            if progress is not None:
                progress(f"{task.instance_id}: {'ok' if report.ok else report.problems}")
    finally:
        if hasattr(backend, "close"):
            backend.close()
    return verdicts


def _python_first_path() -> str:
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
