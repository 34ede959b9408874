"""Where built model artifacts live, and how to build one exactly once.

Two processes may start the same engine at once (a vector env, or pytest-xdist); each builds into
its own temporary directory and renames it into place, so readers only ever see a complete one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# The cache directory of each built-in model; bump a name when its recipe changes.
CACHE_NAMES = {"tiny": "tiny-v1", "smollm2": "smollm2-135m-instruct-v1"}


def cache_root() -> Path:
    """`$HARNESS_GYM_CACHE`, else `~/.cache/harness-gym`."""
    configured = os.environ.get("HARNESS_GYM_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "harness-gym"


def build_once(name: str, build: Callable[[Path], None]) -> Path:
    """Return `cache_root()/name`, calling `build(tmp_dir)` to create it if it is missing.

    The directory appears atomically (a rename), so its existence means it is complete. When two
    builders race, the loser discards its copy and uses the winner's.
    """
    final = cache_root() / name
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every user's runs
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Renaming onto a non-empty directory fails: another process finished first.
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
